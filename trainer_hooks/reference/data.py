"""Deterministic synthetic corpus in sharded memory-mapped token files, and its batch loader.

The corpus is a first-order Markov chain over the vocabulary in which every token has a few
likely successors, so next-token loss falls from ln(vocab) towards the chain's entropy: learnable
structure that makes a corrupted batch stand out. It is written once (`meta.json` last, so a
half-written corpus is regenerated) and then only read through `numpy.memmap`.

A sample is a function of (seed, global batch index, row): the rows of global batch `b` are
drawn from `default_rng([seed, b])`, and data-parallel rank `r` with `accum` micro-batches of
`mbs` rows takes rows `[r*accum*mbs, (r+1)*accum*mbs)`. The same global batch therefore holds
the same rows whatever the dp width, as long as micro-batch x accumulation x dp is unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

META = "meta.json"
SUCCESSORS = 4
SUCCESSOR_P = np.array([0.7, 0.15, 0.1, 0.05])


@dataclass(frozen=True)
class CorpusSpec:
    vocab: int = 256
    tokens: int = 1 << 18
    shards: int = 4
    seed: int = 1234

    def to_json(self) -> dict[str, int]:
        return {
            "vocab": self.vocab,
            "tokens": self.tokens,
            "shards": self.shards,
            "seed": self.seed,
        }


def _markov_tokens(spec: CorpusSpec) -> np.ndarray:
    rng = np.random.default_rng(spec.seed)
    succ = rng.integers(0, spec.vocab, size=(spec.vocab, SUCCESSORS))
    choice = rng.choice(SUCCESSORS, size=spec.tokens, p=SUCCESSOR_P)
    out = np.empty(spec.tokens, dtype=np.int64)
    t = int(rng.integers(0, spec.vocab))
    succ_l, choice_l = succ.tolist(), choice.tolist()
    for i in range(spec.tokens):
        out[i] = t
        t = succ_l[t][choice_l[i]]
    return out


def write_corpus(data_dir: Path, spec: CorpusSpec) -> None:
    """Write the corpus unless an identical one is already there (meta.json is the marker)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = data_dir / META
    if meta.exists() and json.loads(meta.read_text()) == spec.to_json():
        return
    tokens = _markov_tokens(spec).astype(np.uint16 if spec.vocab <= 65535 else np.uint32)
    for i, part in enumerate(np.array_split(tokens, spec.shards)):
        mm = np.memmap(
            data_dir / f"shard-{i:03d}.bin", dtype=part.dtype, mode="w+", shape=part.shape
        )
        mm[:] = part
        mm.flush()
        del mm
    tmp = data_dir / f".{META}.{os.getpid()}"
    tmp.write_text(json.dumps(spec.to_json()))
    tmp.replace(meta)


class Corpus:
    def __init__(self, data_dir: Path) -> None:
        meta = data_dir / META
        if not meta.exists():
            raise FileNotFoundError(f"{data_dir}: no corpus ({META} missing)")
        self.spec = CorpusSpec(**json.loads(meta.read_text()))
        dtype = np.uint16 if self.spec.vocab <= 65535 else np.uint32
        self.shards = [
            np.memmap(data_dir / f"shard-{i:03d}.bin", dtype=dtype, mode="r")
            for i in range(self.spec.shards)
        ]


def parse_skip_list(text: str) -> frozenset[int]:
    """`70-79,95` -> {70..79, 95}. Raises ValueError with the offending part."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"bad skip-list entry {part!r}: want N or A-B") from None
        if a < 0 or b < a:
            raise ValueError(f"bad skip-list range {part!r}")
        out.update(range(a, b + 1))
    return frozenset(out)


class BatchLoader:
    """Yields this dp rank's share of consecutive global batches, skipping the skip list."""

    def __init__(
        self, corpus: Corpus, *, seed: int, seq: int, mbs: int, accum: int, dp: int, dp_rank: int
    ) -> None:
        self.corpus, self.seed, self.seq = corpus, seed, seq
        self.mbs, self.accum, self.dp, self.dp_rank = mbs, accum, dp, dp_rank
        self.skip: frozenset[int] = frozenset()
        self.next_batch = 0

    @property
    def global_batch(self) -> int:
        return self.mbs * self.accum * self.dp

    def rows(self, batch: int) -> np.ndarray:
        """All rows of global batch `batch`: (global_batch, seq + 1) tokens."""
        rng = np.random.default_rng([self.seed, batch])
        shard_len = min(len(s) for s in self.corpus.shards)
        shard = rng.integers(0, len(self.corpus.shards), size=self.global_batch)
        start = rng.integers(0, shard_len - self.seq - 1, size=self.global_batch)
        return np.stack(
            [self.corpus.shards[s][o : o + self.seq + 1] for s, o in zip(shard, start, strict=True)]
        ).astype(np.int64)

    def peek(self) -> int:
        """The global batch the next step trains on (the skip list applied); nothing moves."""
        b = self.next_batch
        while b in self.skip:
            b += 1
        return b

    def jumped(self, batch: int) -> tuple[int, ...]:
        """The batches the skip list steps over before `batch` (the ledger names them)."""
        return tuple(range(self.next_batch, batch))

    def take(self, batch: int) -> None:
        """`batch` is consumed (its step committed): the position moves past it."""
        self.next_batch = batch + 1

    def microbatches(self, batch: int, indices: Sequence[int]) -> torch.Tensor:
        """Micro-batches `indices` of global batch `batch`, in order: (len*mbs, seq+1) tokens.
        Micro-batch m is rows [m*mbs, (m+1)*mbs) of the batch."""
        rows = self.rows(batch)
        parts = [rows[m * self.mbs : (m + 1) * self.mbs] for m in indices]
        return torch.from_numpy(np.concatenate(parts) if parts else rows[:0])

    def share(self) -> range:
        """This data-parallel rank's micro-batches of every global batch (one gang)."""
        return range(self.dp_rank * self.accum, (self.dp_rank + 1) * self.accum)

    def next(self) -> tuple[int, torch.Tensor]:
        """(global batch index, this rank's (accum*mbs, seq+1) tokens); advances the position."""
        b = self.peek()
        self.take(b)
        return b, self.microbatches(b, self.share())

    def state_dict(self) -> dict[str, int]:
        return {"next_batch": self.next_batch, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["global_batch"] != self.global_batch:
            raise ValueError(
                f"checkpoint global batch {state['global_batch']} != this run's {self.global_batch}"
                " (micro-batch x grad-accum x dp must stay the same to resume)"
            )
        self.next_batch = state["next_batch"]
