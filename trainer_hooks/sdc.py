"""Silent-data-corruption spot checks: recompute a fixed workload, compare digests by majority.

Every rank runs the same seeded chain of matrix products on its own device and hashes the
result bit for bit; ranks on the same hardware and software must agree exactly, so a rank that
disagrees with the majority has computed wrongly. Data-parallel replicas hold identical
parameters after the optimizer step, so a digest of the parameters is compared the same way.
Both copy a result to the host (a sync), which is why they run every N steps or on command, not
in every step.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn

_WEIGHT_SEED = 0x5D0C  # the weights are the same on every rank and in every check


def matmul_digest(
    seed: int, size: int = 256, chain: int = 8, device: torch.device | None = None
) -> str:
    """Digest of `chain` products, from a `seed`ed input through fixed weights.

    The weights are drawn once per (size, chain, device) and kept on the device: drawing them
    took a third of a check on CPU. Kept weights that the device corrupts in memory change the
    digest too, which is SDC all the same."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(size, size, generator=gen).to(device)
    for w in _weights(size, chain, torch.device("cpu") if device is None else device):
        x = torch.tanh(x @ w)
    return hashlib.sha256(x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:32]


@functools.lru_cache(maxsize=4)
def _weights(size: int, chain: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(_WEIGHT_SEED)
    scale = size**-0.5  # keeps the chain's magnitude near 1, so no overflow hides a difference
    return tuple((torch.randn(size, size, generator=gen) * scale).to(device) for _ in range(chain))


def param_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        local = p.detach()
        if hasattr(local, "to_local"):  # DTensor: this rank's shard
            local = local.to_local()
        h.update(local.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def digest_to_ints(digest: str) -> list[int]:
    """A 32-hex digest as two non-negative int64s (60 bits each), to travel in a tensor."""
    return [int(digest[:15], 16), int(digest[16:31], 16)]


def ints_to_digest(values: Sequence[int]) -> str:
    return "".join(f"{int(v):015x}" for v in values)


def majority(digests: Sequence[str]) -> tuple[str | None, list[int]]:
    """The digest most ranks agree on, and the ranks that disagree with it.

    With no strict majority (e.g. 1 vs 1) nobody can be blamed: returns (None, []).
    """
    if not digests:
        return None, []
    (top, count), *_ = Counter(digests).most_common()
    if count * 2 <= len(digests):
        return None, []
    return top, [r for r, d in enumerate(digests) if d != top]
