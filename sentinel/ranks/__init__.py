"""Warm rank processes: node hosts, rank processes, and the supervisor's pool of them."""
