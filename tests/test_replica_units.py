"""Fast checks of the replica mode's pure parts: shares of the global batch, the all-reduced
roll, the token ledger and its checker, and the mode's flags (no process group, no torchft
server; the multi-process behaviour is in test_replicas.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainer_hooks.reference.config import ConfigError, parse_config
from trainer_hooks.reference.data import BatchLoader, Corpus, CorpusSpec, write_corpus
from trainer_hooks.reference.ledger import LEDGER_DIR, Layout, LedgerWriter, check
from trainer_hooks.reference.replicas import Roll, StepPlan, shares

LAYOUT = Layout(microbatches=6, mbs=2, seq=16)
STEP_TOKENS = 6 * 2 * 16


def test_full_width_shares_are_the_gangs_and_fewer_replicas_take_more() -> None:
    assert shares(6, 3, 3) == [(0, 1), (2, 3), (4, 5)]  # what dp ranks 0..2 of a gang take
    assert shares(6, 2, 3) == [(0, 1, 2), (3, 4, 5)]
    assert shares(6, 1, 3) == [(0, 1, 2, 3, 4, 5)]
    assert shares(7, 3, 3) == [(0, 1), (2, 3), (4, 5, 6)]
    # a quorum rank beyond the replicas (two processes claiming one) only adds zeros
    assert shares(6, 4, 3) == [(0, 1), (2, 3), (4, 5), ()]
    for n in (1, 2, 3, 4):
        taken = [m for share in shares(6, n, 3) for m in share]
        assert sorted(taken) == list(range(6)), "every micro-batch exactly once"


def test_roll_carries_each_quorum_ranks_replica_step_and_batch() -> None:
    big = (1 << 36) - 2  # the largest step or batch the fp32 roll carries exactly
    cpu = torch.device("cpu")
    rolls = [
        Roll.encode(StepPlan(7, big, 4, 3, rank, ()), replica, torch.tensor(0.5), cpu)
        for rank, replica in enumerate([0, 2, 5])
    ]
    summed = Roll.decode(torch.stack(rolls).sum(0))
    assert summed.loss == 1.5
    assert summed.members == [(0, 7, big), (2, 7, big), (5, 7, big)]


def test_replica_microbatches_are_the_rows_a_gang_rank_trains(tmp_path: Path) -> None:
    write_corpus(tmp_path, CorpusSpec(vocab=64, tokens=20000, shards=2, seed=1))
    corpus = Corpus(tmp_path)
    gang = [BatchLoader(corpus, seed=3, seq=8, mbs=2, accum=2, dp=3, dp_rank=r) for r in range(3)]
    replica = BatchLoader(corpus, seed=3, seq=8, mbs=2, accum=2, dp=3, dp_rank=0)
    whole = torch.cat([loader.next()[1] for loader in gang])
    assert torch.equal(replica.microbatches(0, range(6)), whole)
    assert torch.equal(replica.microbatches(0, (3, 4, 5)), whole[6:])
    assert replica.microbatches(0, ()).shape == (0, 9)
    replica.skip = frozenset({1, 2})
    replica.take(replica.peek())
    assert (replica.peek(), replica.jumped(3)) == (3, (1, 2))


# --- the ledger ----------------------------------------------------------------------------


def write(out: Path, name: str, steps: list[tuple[int, int, dict[int, Any]]], head=None) -> str:
    """Records (step, batch, assignment) for one writer, chained from `head`; the last id."""
    w = LedgerWriter(out / LEDGER_DIR / f"{name}.jsonl", LAYOUT, head=head, writer=name)
    batch = -1 if head is None else None
    for step, b, assignment in steps:
        jumped = range(batch + 1, b) if batch is not None else ()
        w.record(step, b, jumped, 1, assignment)
        batch = b
    w.close()
    assert w.head is not None
    return w.head


FULL = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
NARROW = {0: [0, 1, 2], 2: [3, 4, 5]}


def test_an_exact_ledger_is_the_union_of_what_the_replicas_recorded(tmp_path: Path) -> None:
    steps = [(0, 0, FULL), (1, 1, FULL), (2, 2, NARROW), (3, 3, FULL)]
    write(tmp_path, "replica-0", steps)
    write(tmp_path, "replica-1", steps[:2])  # died before it could record step 2
    write(tmp_path, "replica-2", steps)
    v = check(tmp_path, 4)
    assert v.exact, v.to_json()
    assert v.tokens() == {
        "expected": 4 * STEP_TOKENS,
        "consumed": 4 * STEP_TOKENS,
        "duplicated": 0,
        "skipped": 0,
    }
    assert (v.steps, v.abandoned) == (4, 0)


def test_a_micro_batch_taken_twice_or_never_is_counted(tmp_path: Path) -> None:
    write(tmp_path, "replica-0", [(0, 0, FULL), (1, 1, {0: [0, 1, 2], 1: [2, 3], 2: [4]})])
    v = check(tmp_path, 2)
    mb = 2 * 16
    assert (v.duplicated, v.skipped, v.exact) == (mb, mb, False)


def test_a_missing_step_or_an_unrecorded_jump_is_not_exact(tmp_path: Path) -> None:
    write(tmp_path / "short", "replica-0", [(0, 0, FULL), (1, 1, FULL)])
    v = check(tmp_path / "short", 3)
    assert not v.exact and v.skipped == STEP_TOKENS and "no record of step 2" in v.problems[0]
    head = write(tmp_path / "jump", "replica-0", [(0, 0, FULL)])
    w = LedgerWriter(tmp_path / "jump" / LEDGER_DIR / "replica-0.jsonl", LAYOUT, head, "r0")
    w.record(1, 5, (), 1, FULL)  # batches 1-4 were not on the skip list
    v = check(tmp_path / "jump", 2)
    assert not v.exact and "jumps [1, 2, 3, 4]" in v.problems[0]


def test_a_branch_a_lost_commit_left_is_abandoned_not_counted(tmp_path: Path) -> None:
    """Replica 1 committed step 1 alone and died; the others redid step 1 (the run's branch)."""
    head = write(tmp_path, "replica-0", [(0, 0, FULL)])
    write(tmp_path, "replica-1", [(1, 1, {1: [0, 1, 2, 3, 4, 5]})], head=head)
    write(tmp_path, "replica-0b", [(1, 1, NARROW), (2, 2, FULL)], head=head)
    v = check(tmp_path, 3)
    assert v.exact, v.to_json()
    assert (v.steps, v.abandoned) == (3, 1)


def test_the_last_step_committed_two_ways_is_not_exact(tmp_path: Path) -> None:
    head = write(tmp_path, "replica-0", [(0, 0, FULL)])
    write(tmp_path, "replica-1", [(1, 1, FULL)], head=head)
    write(tmp_path, "replica-2", [(1, 1, NARROW)], head=head)
    assert "committed 2 different ways" in check(tmp_path, 2).problems[0]


def test_ledger_cli_exit_codes(tmp_path: Path) -> None:
    write(tmp_path, "gang", [(0, 0, FULL), (1, 1, FULL)])
    cli = [sys.executable, "-m", "trainer_hooks.reference.ledger", str(tmp_path)]
    ok = subprocess.run([*cli, "--steps", "2", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["exact"] is True
    short = subprocess.run([*cli, "--steps", "3"], capture_output=True, text=True)
    assert short.returncode == 1 and "exact=False" in short.stdout
    bad = subprocess.run([*cli[:-1], str(tmp_path / "none"), "--steps", "2"], capture_output=True)
    assert bad.returncode == 2


# --- the mode's flags ------------------------------------------------------------------------

ENV = {"SENTINEL_REPLICA": "1", "TORCHFT_LIGHTHOUSE": "http://lighthouse:29510"}


def test_replica_mode_config(tmp_path: Path) -> None:
    argv = ["--tp", "2", "--dp", "3", "--replicas", "ft", "--out", str(tmp_path)]
    cfg = parse_config(argv, 2, ENV)
    assert cfg.ft is not None and (cfg.ft.replica, cfg.ft.lighthouse) == (
        1,
        ENV["TORCHFT_LIGHTHOUSE"],
    )
    assert (cfg.dp, cfg.microbatches, cfg.global_batch) == (3, 6, 12)
    assert cfg.ckpt_dir == tmp_path / "ckpt" / "replica-1"
    assert (cfg.ft.timeout_s, cfg.ft.quorum_timeout_s, cfg.ft.connect_timeout_s) == (30, 120, 10)
    flagged = parse_config(
        [*argv, "--ft-timeout", "5"], 2, ENV | {"TORCHFT_QUORUM_TIMEOUT_SEC": "9"}
    )
    assert flagged.ft is not None and (flagged.ft.timeout_s, flagged.ft.quorum_timeout_s) == (5, 9)
    assert not cfg.ft.heal
    healing = parse_config([*argv, "--ft-heal"], 2, ENV)
    assert healing.ft is not None and healing.ft.heal


@pytest.mark.parametrize(
    ("argv", "world", "env", "msg"),
    [
        (["--replicas", "ft"], 1, ENV, "give --dp"),
        (["--replicas", "ft", "--dp", "3", "--tp", "2"], 6, ENV, "must equal WORLD_SIZE=6"),
        (["--replicas", "ft", "--dp", "3"], 1, {**ENV, "SENTINEL_REPLICA": "3"}, "want 0 .. 2"),
        (["--replicas", "ft", "--dp", "3"], 1, {"SENTINEL_REPLICA": "0"}, "TORCHFT_LIGHTHOUSE"),
        (["--replicas", "ft", "--dp", "2", "--dp-mode", "fsdp"], 1, ENV, "must be allreduce"),
        (["--replicas", "ft", "--dp", "2", "--ft-timeout", "0"], 1, ENV, "want seconds > 0"),
        (["--replicas", "ft", "--dp", "2"], 1, {**ENV, "TORCHFT_TIMEOUT_SEC": "x"}, "want seconds"),
        (["--ft-heal"], 1, ENV, "only a replica heals"),
        (
            ["--replicas", "ft", "--dp", "2", "--ft-heal", "--resume-from", "latest"],
            1,
            ENV,
            "not with --resume-from",
        ),
    ],
)
def test_replica_mode_refuses_bad_flags(
    argv: list[str], world: int, env: dict[str, str], msg: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=msg):
        parse_config([*argv, "--out", str(tmp_path)], world, env)


def test_gang_mode_reads_no_replica_environment(tmp_path: Path) -> None:
    cfg = parse_config(["--out", str(tmp_path)], 1, {"SENTINEL_REPLICA": "junk"})
    assert cfg.ft is None and cfg.ckpt_dir == tmp_path / "ckpt"
    assert np.isclose(cfg.microbatches, cfg.accum * cfg.dp)
