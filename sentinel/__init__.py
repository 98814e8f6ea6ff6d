"""Sentinel: observability and reliability for GPU training fleets."""

__version__ = "0.1.0"
