"""One number the projection uses, with where it came from: measured, a setting, an assumption
(with its source), or the command line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Origin = Literal["measured", "setting", "assumption", "command line"]


@dataclass(frozen=True)
class Input:
    key: str
    label: str
    value: float
    unit: str
    origin: Origin
    source: str
