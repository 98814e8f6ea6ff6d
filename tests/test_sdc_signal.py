"""The SDC signal in one process: what a rank reports when its spot-check digest disagrees
(with a stand-in for the gang exchange), and the faulty-GEMM fault seen by that check."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sentinel.protocol import Command, CommandKind, Source
from trainer_hooks import HooksConfig, SentinelHooks


class Gang:
    """Four ranks; this process is rank 2. The others agree with it until `odd` is set."""

    rank, world, active = 2, 4, True

    def __init__(self) -> None:
        self.odd = False

    def gather(self, values: Sequence[float]) -> list[list[float]]:
        return [list(values)] * self.world

    def gather_digests(self, digests: Sequence[str]) -> list[list[str]]:
        others = ["0" * 30] * len(digests) if self.odd else list(digests)
        return [list(digests) if r == self.rank else others for r in range(self.world)]


def test_a_disagreeing_rank_reports_since_when_its_results_are_suspect(tmp_path: Path) -> None:
    cfg = HooksConfig(agent_socket=str(tmp_path / "none.sock"), exchange_every=5, sdc_every=5)
    hooks = SentinelHooks(cfg)
    gang = Gang()
    hooks.exchange = gang  # type: ignore[assignment]
    try:
        for step in range(100, 120):  # resumed at step 100
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
    got = [(p["step"], p["mismatch"], p["suspect_since"], p["check_id"]) for p in sdc]
    assert got == [
        (104, False, None, "sdc-104"),
        (109, False, None, "sdc-109"),
        (114, True, 110, "sdc-114"),  # the last check all ranks passed was after step 109
        (119, True, 110, "recompute-1"),  # the recompute quotes the command's id
    ]
    assert all(p["mismatched_ranks"] == ([2] if p["mismatch"] else []) for p in sdc)


def test_with_no_clean_check_yet_everything_since_the_start_is_suspect(tmp_path: Path) -> None:
    cfg = HooksConfig(agent_socket=str(tmp_path / "none.sock"), exchange_every=5, sdc_every=5)
    hooks = SentinelHooks(cfg)
    gang = Gang()
    gang.odd = True
    hooks.exchange = gang  # type: ignore[assignment]
    try:
        for step in range(30, 35):
            with hooks.step(step):
                pass
    finally:
        hooks.close()
    (p,) = [e.payload for e in hooks.transport.pending_events() if e.kind == "rank.sdc"]
    assert (p["step"], p["mismatch"], p["suspect_since"]) == (34, True, 30)
