"""`sentinel demo` as the drill tests run it, and the checks of its result.json that more than one
of them makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SENTINEL = [sys.executable, "-m", "sentinel"]


def demo(
    scenario: str,
    tmp_path: Path,
    cache: Path,
    quick: bool = True,
    timeout_s: float = 420,
    recovery: str | None = None,
) -> tuple[int, dict[str, Any], str]:
    """`sentinel demo` on `scenario` in a subprocess, its reference runs cached in `cache`:
    (exit code, result.json, stdout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    env["SENTINEL_DEMO_CACHE"] = str(cache)
    out, result = tmp_path / "out", tmp_path / "result.json"
    done = subprocess.run(
        [*SENTINEL, "demo", "--scenario", scenario, *(["--quick"] if quick else []),
         *(["--recovery", recovery] if recovery else []), "--out", str(out), "--json",
         str(result)],
        env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert result.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "report.html").exists() and (out / "goodput.json").exists()
    # The live timeline, saved line by line in the run directory as it was printed.
    timeline = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    assert (
        any(e["kind"] == "fault" for e in timeline) or not json.loads(result.read_text())["faults"]
    )
    return done.returncode, json.loads(result.read_text()), done.stdout


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
