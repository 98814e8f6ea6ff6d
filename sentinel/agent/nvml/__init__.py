"""Reading GPUs: the backend seam and its sweeps, the real NVML backend through pynvml, and
the simulated GPUs."""
