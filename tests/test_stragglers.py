"""Runtime stragglers in the reference trainer, at the hooks' shipped defaults, on real gloo
ranks: a rank whose device does more work per step (10% in TP2 x PP2 x DP2, 5% in DP4) is named
within 100 steps, and before its slowdown starts (200 clean steps) no rank is named.

The slowdown is real work (`trainer_hooks.reference.slowdown`), and the hooks find it from
their own timings, with the ranks it holds up waiting for it in every kind of collective the
layout has. `benchmarks/stragglers.py` repeats these runs and counts false names over 1,000
clean steps per layout.
"""

from __future__ import annotations

import pytest

from tests.hooks_support.straggler_runs import Layout, run

pytestmark = pytest.mark.slow

ONSET = 200


def _named(layout: str, rank: int, slowdown: float) -> None:
    fault = f"straggler:rank={rank},slowdown={slowdown},at_step={ONSET}"
    named = run(Layout.parse(layout), ONSET + 105, fault)
    assert [n for n in named if n.step < ONSET] == [], "named before the slowdown started"
    assert {n.rank for n in named} == {rank}, named
    assert min(n.step for n in named) <= ONSET + 100, named


def test_tp_pp_dp_rank_slowed_ten_percent_is_named() -> None:
    # TP2 x PP2 x DP2: rank 5 (second stage, second TP shard) makes its TP partner wait in
    # DTensor's all-reduces, the first stage in pipeline receives and its replica in the
    # data-parallel all-reduce.
    _named("2x2x2", 5, 1.10)


def test_data_parallel_rank_slowed_five_percent_is_named() -> None:
    # DP4: rank 2 holds up the others in the gradient all-reduce only.
    _named("1x1x4", 2, 1.05)
