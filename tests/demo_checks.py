"""Checks of a drill's result.json that more than one drill test makes."""

from __future__ import annotations

import json
from typing import Any


def assert_same_model(res: dict[str, Any]) -> None:
    """The run ends with the clean run's model: bit for bit, or, where a replica was repaired
    live (the survivors summed its share of the gradients in another order), with its final
    loss within the stated tolerance (docs/recovery.md). Either way every sample was consumed
    once."""
    assert res["ledger_exact"], res["tokens"]
    if any(r["path"] == "live" for r in res["repairs"]):
        assert res["final_loss_within_tolerance"], (res["final_loss"], res["reference_final_loss"])
    else:
        assert res["bit_identical"] and res["final_digest"] == res["reference_digest"]


def why(res: dict[str, Any]) -> str:
    """A failed drill's reasons first, then the end of its result (where the repairs are)."""
    return "\n".join([*res.get("problems", []), json.dumps(res, indent=1)[-3000:]])
