"""Young/Daly: the checkpoint interval that minimises checkpoint overhead plus lost work."""

from __future__ import annotations

import math


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """√(2 · C · M) (Young 1974; Daly 2006's first-order term), in seconds of training.

    Saving more often wastes C per save; saving less often loses half an interval on average
    per failure. The sum C/τ + τ/(2M) is smallest at τ = √(2CM).
    """
    if checkpoint_cost_s < 0 or mtbf_s <= 0:
        raise ValueError("checkpoint cost must be >= 0 and MTBF > 0")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)
