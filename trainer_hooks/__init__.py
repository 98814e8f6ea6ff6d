"""In-trainer library: step timing, MFU, anomalies, stragglers, SDC checks, hang watchdog."""
