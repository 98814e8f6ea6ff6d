"""The simulated-fleet demo: its result data and the HTML report it writes."""
