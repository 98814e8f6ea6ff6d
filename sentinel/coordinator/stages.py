"""Where `sentinel.demo` finds a repair's stages (`core/stages.py`) until it imports them there."""

from sentinel.coordinator.core.stages import MILESTONES, segments

__all__ = ["MILESTONES", "segments"]
