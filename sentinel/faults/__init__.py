"""What faults mean: the XID catalog and the health-rule table, shared by agent and coordinator."""
