"""The agent's Prometheus exposition: GPU, node, rank and plumbing series."""
