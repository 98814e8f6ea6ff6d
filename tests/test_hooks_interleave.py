"""`--hooks-interleave`: one reference-trainer run alternating hooks-on and hook-less blocks.

Real 2-rank gloo runs of the reference trainer (tiny model, a dozen steps): the run completes,
both arms get steps, every rank follows the same seeded schedule, the hooks' periodic work
follows their own count of hooked steps; ranks holding different schedules stop together with
exit 2 instead of deadlocking on the hooks' side group.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from trainer_hooks import interleave
from trainer_hooks.reference import train
from trainer_hooks.reference.config import ConfigError, parse_config
from trainer_hooks.reference.launch import launch, run_gang

MODEL = ["--layers", "2", "--dim", "32", "--heads", "4", "--seq", "16", "--vocab", "128"]
MODEL += ["--corpus-tokens", "65536", "--quiet"]
STEPS, BLOCK, SEED = 12, 2, 3
# Exchange every 2 hooked steps, SDC check every 4: the side group is used often in 12 steps.
HOOKS_ENV = {"SENTINEL_HOOKS_EXCHANGE_EVERY": "2", "SENTINEL_HOOKS_SDC_EVERY": "4"}


def _args(out: Path, *extra: str) -> list[str]:
    return [*MODEL, "--out", str(out), "--steps", str(STEPS), *extra]


def test_schedule_pairs_blocks_and_is_seeded() -> None:
    arms = interleave.schedule(40, 2, seed=5)
    assert len(arms) == 40 and sum(arms) == 20
    for pair in range(10):  # each pair: one on block and one off block, in either order
        a, b = arms[4 * pair : 4 * pair + 2], arms[4 * pair + 2 : 4 * pair + 4]
        assert len(set(a)) == 1 and len(set(b)) == 1 and a[0] != b[0]
    assert interleave.schedule(40, 2, seed=5) == arms
    assert {tuple(interleave.schedule(40, 2, seed=s)) for s in range(5)} != {tuple(arms)}
    assert interleave.fingerprint(arms) != interleave.fingerprint(interleave.schedule(40, 2, 6))
    with pytest.raises(ValueError, match="block >= 1"):
        interleave.schedule(10, 0)
    for step in range(40):  # a step's twin: same pair, same place, the other arm
        other = interleave.twin(step, 2)
        assert other // 4 == step // 4 and other % 2 == step % 2 and arms[other] != arms[step]
        assert interleave.twin(other, 2) == step


def test_the_overhead_statistic_trims_both_arms_alike() -> None:
    """Every 4th pair holds periodic work; the only outliers are one preempted step per such
    pair in each arm (2x the step time). The arms cost the same: the ratio must be 1. Keeping
    the on-arm's periodic steps whole while trimming every off-step read the same steps 1.018."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import hooks as bench  # benchmarks/hooks.py

    arms = interleave.schedule(400, 2, seed=1)
    periodic: list[str | None] = [None] * 400
    wall = [0.4] * 400
    for pair in range(0, 100, 4):
        on_first = arms[4 * pair]
        on_step, off_step = (4 * pair, 4 * pair + 2) if on_first else (4 * pair + 2, 4 * pair)
        periodic[on_step] = "exchange"
        wall[on_step] = wall[off_step] = 0.8  # preempted, in both arms alike
    rec = {"steps": list(range(400)), "on": arms, "periodic": periodic, "wall_s": wall}
    rec |= {"cpu_s": wall, "hook_errors": 0}
    figures = bench.analyze_interleaved([rec], warmup=0, block=2)
    assert figures["hook_overhead_ratio"] == 1.0
    assert figures["interleaved_periodic_steps"] == 25


def test_bad_block_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--hooks-interleave -1"):
        parse_config(_args(tmp_path, "--hooks-interleave", "-1"), 1)
    assert parse_config(_args(tmp_path), 1).hooks_interleave == 0


@pytest.mark.slow
def test_interleaved_run_both_arms_same_schedule(tmp_path: Path) -> None:
    env = dict(os.environ, **HOOKS_ENV)
    extra = ["--hooks-interleave", str(BLOCK), "--hooks-interleave-seed", str(SEED)]
    run_gang(2, _args(tmp_path, *extra), log_dir=tmp_path / "logs", timeout=120, env=env, fork=True)
    records = [json.loads((tmp_path / f"hooks-interleave-{r}.json").read_text()) for r in (0, 1)]
    expected = interleave.schedule(STEPS, BLOCK, SEED)
    for r, rec in enumerate(records):
        assert rec["rank"] == r and rec["hook_errors"] == 0
        assert rec["steps"] == list(range(STEPS))
        assert rec["on"] == expected  # the same schedule on every rank
        assert rec["fingerprint"] == interleave.fingerprint(expected)
        assert 0 < sum(rec["on"]) < STEPS  # both arms got steps
        assert all(w > 0 for w in rec["wall_s"]) and len(rec["cpu_s"]) == STEPS
        # Periodic work only in on-steps, at the hooks' own count of hooked steps.
        hooked = [i for i, on in enumerate(rec["on"]) if on]
        marks = [rec["periodic"][i] for i in hooked]
        assert marks == [_periodic_work(n) for n in range(1, len(hooked) + 1)]
        assert all(rec["periodic"][i] is None for i in range(STEPS) if not rec["on"][i])
    # The loss curve is the trainer's: every step reported once, by rank 0.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if '"step"' in x] == list(range(1, STEPS + 1))


def _periodic_work(n: int) -> str | None:
    """What the n-th hooked step does with an exchange every 2 and an SDC check every 4: an
    exchange is posted at every even step and taken at the next; taking the one posted at a
    multiple of 4 computes an SDC check's digests ("sdc"), posted and judged one step later."""
    if n >= 5 and n % 4 == 1:
        return "sdc"
    return "exchange" if n >= 2 else None


def _seed_per_rank(argv: list[str]) -> int:
    """A rank whose --hooks-interleave-seed is its rank: the ranks' schedules differ."""
    return train.main([*argv, "--hooks-interleave-seed", os.environ["RANK"]])


@pytest.mark.slow
def test_ranks_with_different_schedules_stop_together(tmp_path: Path) -> None:
    env = dict(os.environ, **HOOKS_ENV)
    args = _args(tmp_path, "--hooks-interleave", "1")
    gang = launch(2, args, log_dir=tmp_path / "logs", env=env, fork=True, entry=_seed_per_rank)
    codes = gang.wait(90)
    if any(c is None for c in codes):
        gang.kill()
    assert codes == [2, 2], [gang.tail(r) for r in (0, 1)]
    for r in (0, 1):
        assert "schedules differ across ranks" in gang.tail(r)
    assert not (tmp_path / "hooks-interleave-0.json").exists()
