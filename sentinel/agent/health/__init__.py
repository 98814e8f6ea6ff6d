"""Health: readings, XIDs and node signals in; a verdict and recommended action per GPU and
node, through one raise / clear / hold state machine."""
