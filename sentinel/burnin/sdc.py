"""Phase 4: silent data corruption in arithmetic, by computing the same thing twice everywhere.

Each rank runs a seeded chain of matrix products (squashed by tanh to stay bounded), twice, and
digests the result. Identical hardware and software give bit-identical results, so a rank whose
digest differs from the majority of its peers (same device model), or from its own repeat, has
arithmetic that cannot be trusted. nccl-tests' `-c` catches corruption in transport; this
catches it in compute.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sentinel.burnin.comm import Comm, Compute


@dataclass(frozen=True)
class RankDigest:
    first: str | None
    second: str | None
    device: str
    error: str | None = None


def chain_digest(compute: Compute, size: int, chain: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, size, generator=g).to(compute.device)
    scale = size**-0.5
    for _ in range(chain):
        w = (torch.randn(size, size, generator=g) * scale).to(compute.device)
        x = torch.tanh(compute.matmul(x, w))
    return hashlib.sha256(x.cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def measure(comm: Comm, compute: Compute, size: int, chain: int, seed: int) -> list[RankDigest]:
    try:
        mine = RankDigest(
            chain_digest(compute, size, chain, seed),
            chain_digest(compute, size, chain, seed),
            device_name(compute.device),
        )
    except RuntimeError as e:
        mine = RankDigest(None, None, device_name(compute.device), error=str(e))
    return comm.gather_objects(mine)


def judge(digests: Sequence[RankDigest]) -> tuple[list[int], dict[int, str]]:
    """Mismatched ranks and why; the majority is taken among ranks of the same device model."""
    reasons: dict[int, str] = {}
    by_device: dict[str, list[int]] = {}
    for r, d in enumerate(digests):
        if d.error:
            reasons[r] = f"SDC workload failed: {d.error}"
        else:
            by_device.setdefault(d.device, []).append(r)
    for ranks in by_device.values():
        votes = Counter(digests[r].first for r in ranks)
        majority, count = votes.most_common(1)[0]
        for r in ranks:
            d = digests[r]
            if d.first != d.second:
                reasons[r] = f"digest differs from its own repeat ({d.first} vs {d.second})"
            elif d.first != majority:
                reasons[r] = f"digest {d.first} differs from {count}/{len(ranks)} ranks' {majority}"
    return sorted(reasons), reasons
