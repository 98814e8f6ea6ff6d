"""The simulated fleet: real Sentinel processes on one machine, with simulated GPUs."""
