"""The gang exchange's decisions in one process, with a stand-in for the exchange: what a rank
reports when its SDC spot-check digest disagrees, and when the exchange's results are acted on."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from sentinel.protocol import Command, CommandKind, Source
from trainer_hooks import HooksConfig, SentinelHooks
from trainer_hooks.exchange import Gathered


class Gang:
    """Four ranks; this process is rank 2. The others agree with it until `odd` is set."""

    rank, world, active = 2, 4, True

    def __init__(self) -> None:
        self.odd = False
        self.digest_posts = 0

    def gather(self, values: Sequence[float]) -> Gathered[list[float]]:
        return Gathered.ready([list(values)] * self.world)

    def gather_digests(self, digests: Sequence[str]) -> Gathered[list[str]]:
        self.digest_posts += 1
        others = ["0" * 30] * len(digests) if self.odd else list(digests)
        return Gathered.ready(
            [list(digests) if r == self.rank else others for r in range(self.world)]
        )


def test_a_disagreeing_rank_reports_since_when_its_results_are_suspect(tmp_path: Path) -> None:
    cfg = HooksConfig(agent_socket=str(tmp_path / "none.sock"), exchange_every=5, sdc_every=5)
    hooks = SentinelHooks(cfg)
    gang = Gang()
    hooks.exchange = gang  # type: ignore[assignment]
    try:
        for step in range(100, 122):  # resumed at step 100
            gang.odd = step >= 112
            if step == 116:  # the coordinator's recompute-diff
                args = {"step": 114, "check_id": "recompute-1"}
                hooks._on_command(
                    Command(kind=CommandKind.SDC_CHECK, target=Source(job="j"), args=args)
                )
            with hooks.step(step):
                pass
    finally:
        hooks.close()
    sdc = [e.payload for e in hooks.transport.pending_events() if e.kind == "rank.sdc"]
    got = [(p.step, p.mismatch, p.suspect_since, p.check_id) for p in sdc]
    # An exchange every 5 steps (104, 109, ...) is acted on at the next step, where the check
    # computes its digests (its step), and judged one step later.
    assert got == [
        (105, False, None, "sdc-105"),
        (110, False, None, "sdc-110"),
        (115, True, 111, "sdc-115"),  # the last check all ranks passed was after step 110
        (120, True, 111, "recompute-1"),  # the recompute quotes the command's id
    ]
    assert all(p.mismatched_ranks == ([2] if p.mismatch else []) for p in sdc)


def test_with_no_clean_check_yet_everything_since_the_start_is_suspect(tmp_path: Path) -> None:
    cfg = HooksConfig(agent_socket=str(tmp_path / "none.sock"), exchange_every=5, sdc_every=5)
    hooks = SentinelHooks(cfg)
    gang = Gang()
    gang.odd = True
    hooks.exchange = gang  # type: ignore[assignment]
    try:
        for step in range(30, 37):
            with hooks.step(step):
                pass
    finally:
        hooks.close()
    (p,) = [e.payload for e in hooks.transport.pending_events() if e.kind == "rank.sdc"]
    assert (p.step, p.mismatch, p.suspect_since) == (35, True, 30)


def test_the_exchange_is_acted_on_a_step_later_and_close_starts_no_collective(
    tmp_path: Path,
) -> None:
    cfg = HooksConfig(agent_socket=str(tmp_path / "none.sock"), exchange_every=5, sdc_every=5)
    hooks = SentinelHooks(cfg)
    gang = Gang()
    hooks.exchange = gang  # type: ignore[assignment]
    hooks._on_command(Command(kind=CommandKind.CHECKPOINT_NOW, target=Source(job="j")))
    due, work = [], []
    try:
        for step in range(10):
            with hooks.step(step):
                pass
            due.append(hooks.should_checkpoint())
            work.append(hooks.periodic_work)
    finally:
        hooks.close()
    # posted after step 4, taken after step 5 (the checkpoint, on every rank at once, and the
    # SDC check's digests), the check judged after step 6; step 9's exchange is taken by close
    assert [s for s, d in enumerate(due) if d] == [5]
    assert work == [None] * 4 + ["exchange", "sdc", "exchange", None, None, "exchange"]
    # close took step 9's exchange, whose periodic check falls due, but posted no digests: a
    # rank closing on an error path may have peers that never will
    assert gang.digest_posts == 1
    sdc = [e.payload for e in hooks.transport.pending_events() if e.kind == "rank.sdc"]
    assert [p.step for p in sdc] == [5]


def test_a_save_begun_answers_every_checkpoint_request_issued_before_it(tmp_path: Path) -> None:
    """A trainer with a per-step collective saves a step after a `checkpoint.now`: the save
    answers that command on this rank, a copy of it reaching this rank later, and the exchange
    that already carried it; a command issued after the save asks again."""
    cfg = HooksConfig(agent_socket=str(tmp_path / "none.sock"), exchange_every=2, sdc_every=0)
    hooks = SentinelHooks(cfg)
    hooks.exchange = Gang()  # type: ignore[assignment]
    before = time.time()
    command = Command(kind=CommandKind.CHECKPOINT_NOW, target=Source(job="j"), ts=before)
    hooks._on_command(command)
    due = []
    try:
        with hooks.step(0):
            pass
        with hooks.step(1):  # the exchange after it carries the request
            pass
        assert not hooks.checkpoint_asked()  # taken by the exchange, posted on every rank
        hooks._requests["checkpoint"].set()  # another rank's copy, as the per-step flag sees it
        assert hooks.checkpoint_asked()
        hooks.saving()  # every rank, the step after the first one heard of it
        hooks._on_command(command)  # this rank's copy of the same command, late
        assert not hooks.checkpoint_asked()
        for step in range(2, 6):
            with hooks.step(step):
                pass
            due.append(hooks.should_checkpoint())
        assert due == [False] * 4  # the exchange's request was answered by the save
        later = Command(kind=CommandKind.CHECKPOINT_NOW, target=Source(job="j"), ts=time.time())
        hooks._on_command(later)
        assert hooks.checkpoint_asked()
    finally:
        hooks.close()
