"""In-trainer library: step timing, MFU, anomalies, stragglers, SDC checks, hang watchdog.

`from trainer_hooks import SentinelHooks, enable_flight_recorder` is all a loop needs.
"""

from trainer_hooks.config import HooksConfig, HooksConfigError
from trainer_hooks.flight import enable_flight_recorder
from trainer_hooks.hooks import SentinelHooks

__all__ = ["HooksConfig", "HooksConfigError", "SentinelHooks", "enable_flight_recorder"]
