"""Checks of a drill's result.json that more than one drill test makes."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+) ")


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


def why(res: dict[str, Any], out: Path) -> str:
    """A failed drill's reasons first, then what its logs say about time lost (`out`: the
    drill's run directory), then the end of its result without the fleet projection."""
    brief = {k: v for k, v in res.items() if k not in ("fleet_projection", "drill_settings")}
    evidence = [*_supervisor_timeline(out), *_rank_log_gaps(out)]
    return "\n".join([*res.get("problems", []), *evidence, json.dumps(brief, indent=1)[-2500:]])


def _supervisor_timeline(out: Path, limit: int = 30) -> list[str]:
    """The supervisor's log from its first repair command on, one line per record."""
    log = out / "supervisor.log"
    if not log.exists():  # the drill failed before its supervisor started
        return []
    recs = []
    for line in log.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            continue
    first = next((i for i, r in enumerate(recs) if "job.restart" in str(r.get("msg"))), 0)
    t0 = recs[0]["ts"] if recs else 0.0
    lines = [f"  {r['ts'] - t0:7.2f} {str(r.get('msg'))[:110]}" for r in recs[first:]]
    return ["supervisor (s from its start):", *lines[:limit]]


def _rank_log_gaps(out: Path, gap_s: float = 5.0, limit: int = 24) -> list[str]:
    """Every pause of more than `gap_s` between two lines of a rank's log: the line before it
    and the line after it, the file named."""
    found = []
    for log in sorted((out / "logs").glob("g*-rank*.log")):
        last: tuple[datetime, str] | None = None
        for line in log.read_text(errors="replace").splitlines():
            m = _STAMP.match(line)
            if m is None:
                continue
            t = datetime.fromisoformat(m.group(1))
            if last is not None and (t - last[0]).total_seconds() > gap_s:
                pause = (t - last[0]).total_seconds()
                found += [
                    f"{log.name}: {pause:.1f} s between",
                    f"  {last[1][:150]}",
                    f"  {line[:150]}",
                ]
            last = (t, line)
    return ["rank log pauses over 5 s:", *found[: limit * 3]] if found else []
