"""A digest of all parameters that is the same for any (tp, pp, dp) layout of the same values.

Each parameter is gathered to its full tensor (DTensor.full_tensor over tp), hashed with its
name, dtype and shape; the (dp 0, tp 0) rank of each stage contributes its stage's hashes, and
the digest is sha256 over all of them sorted by parameter name.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


def tensor_sha256(name: str, t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def param_digest(model: nn.Module, mesh: DeviceMesh) -> str:
    """Collective over the world: every rank gets the same hex digest."""
    hashes: dict[str, str] = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        hashes[name] = tensor_sha256(name, full)
    contributes = mesh["dp"].get_local_rank() == 0 and mesh["tp"].get_local_rank() == 0
    gathered: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, hashes if contributes else {})
    merged: dict[str, str] = {}
    for part in gathered:
        merged.update(part or {})
    top = hashlib.sha256()
    for name in sorted(merged):
        top.update(f"{name}={merged[name]}\n".encode())
    return top.hexdigest()
