"""The node agent: NVML and host collection, health verdicts, /metrics, event delivery."""
