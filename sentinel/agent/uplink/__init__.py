"""The agent's link to the coordinator: the spool and delivery of events, the commands it
polls, flight-recorder dumps it carries, validations it runs and the node evidence it gathers
when asked."""
