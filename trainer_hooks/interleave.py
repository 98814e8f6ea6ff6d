"""Hooks on / hooks off within one run: the arm of every step, the same on every rank.

An overhead measurement that compares two whole runs mostly measures how the machine's load
drifted between them. Interleaving the arms inside one run makes both see the same machine:
steps come in pairs of blocks of `block` steps, one block with every hook on and one with the
hooks bypassed, each pair in a seeded random order so that neither arm always runs first or on
the same step parity. Every rank must compute the same schedule (the hooks' gang exchange runs
collectives on a side group only in on-steps, so ranks that disagreed would deadlock);
`check_agreement` verifies that with one small all-reduce before the first step.
"""

from __future__ import annotations

import hashlib
import random

import torch
import torch.distributed as dist


class ScheduleMismatchError(RuntimeError):
    """The ranks computed different on/off schedules (raised on every rank at once)."""


def schedule(steps: int, block: int, seed: int = 0) -> list[bool]:
    """On (True) / off per step: pairs of `block`-step blocks, each pair in a random order."""
    if steps < 0 or block < 1:
        raise ValueError(f"schedule: want steps >= 0 and block >= 1, got {steps}, {block}")
    rng = random.Random(seed)
    out: list[bool] = []
    while len(out) < steps:
        first = rng.random() < 0.5
        out += [first] * block + [not first] * block
    return out[:steps]


def twin(step: int, block: int) -> int:
    """The step at the same place in the other block of `step`'s pair (the other arm)."""
    return step + block if step % (2 * block) < block else step - block


def fingerprint(arms: list[bool]) -> int:
    """A 62-bit digest of a schedule, to compare across ranks in an int64 tensor."""
    digest = hashlib.sha256(bytes(arms)).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def check_agreement(arms: list[bool], group: dist.ProcessGroup | None = None) -> None:
    """Raise `ScheduleMismatchError` on every rank unless all ranks hold the same schedule.

    One all-reduce (MAX) of (fingerprint, -fingerprint): max == min exactly when all agree, and
    every rank learns the same answer, so either all ranks go on or all stop; none is left
    waiting in a collective that its peers never enter."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    mine = fingerprint(arms)
    t = torch.tensor([mine, -mine], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    high, low = int(t[0]), -int(t[1])
    if high != low:
        raise ScheduleMismatchError(
            f"rank {dist.get_rank(group)}: hooks on/off schedules differ across ranks "
            f"(fingerprints {low:#x}..{high:#x}, mine {mine:#x}); every rank needs the same "
            "--hooks-interleave, --hooks-interleave-seed and --steps"
        )
