"""Model FLOPs utilisation, counted the way TorchTitan counts it.

FLOPs per token = 6 x non-embedding parameters + 12 x L x H x Q x T, where L is the number of
layers, H the attention heads, Q the head dimension and T the sequence length: 6 for forward and
backward of every weight matmul, 12 for the two attention matmuls (2 forward + 4 backward, x2
for multiply-add); causal sparsity and activation recomputation are not counted. MFU is achieved
FLOP/s divided by the device's dense bf16 peak.
"""

from __future__ import annotations

import time

import torch
from torch import nn

# Dense (no sparsity) bf16 tensor-core peak, FLOP/s, from the vendors' data sheets.
PEAK_FLOPS: dict[str, float] = {
    "B200": 2250e12,
    "B100": 1750e12,
    "H200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIE": 756e12,
    "H100": 989e12,  # SXM and unlisted variants
    "H800": 989e12,
    "H20": 148e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "MI300X": 1307e12,
}


def non_embedding_params(model: nn.Module) -> int:
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(
        p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    )
    return total - embedding


def flops_per_token(
    n_params_non_embedding: int,
    *,
    layers: int = 0,
    heads: int = 0,
    head_dim: int = 0,
    seq_len: int = 0,
) -> float:
    """TorchTitan's dense-transformer count; leave the attention shape at 0 without attention."""
    return 6.0 * n_params_non_embedding + 12.0 * layers * heads * head_dim * seq_len


def lookup_peak_flops(device_name: str) -> float | None:
    """Peak for a CUDA device name such as "NVIDIA H100 80GB HBM3"; None if the model is unknown."""
    name = device_name.upper()
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):  # "H100 NVL" before "H100"
        if key in name:
            return PEAK_FLOPS[key]
    return None


def measure_cpu_peak_flops(n: int = 512, repeats: int = 5) -> float:
    """Best float32 GEMM rate achieved on this CPU: MFU's denominator where no table applies."""
    # A private generator: the hooks must never move the training loop's global RNG state.
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    torch.mm(a, b)  # warm up the BLAS threads
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        if dt > 0:
            best = max(best, 2.0 * n**3 / dt)
    return best


def device_peak_flops(device: torch.device, override: float | None = None) -> float:
    if override is not None:
        return override
    if device.type == "cuda":
        peak = lookup_peak_flops(torch.cuda.get_device_name(device))
        if peak is not None:
            return peak
    return measure_cpu_peak_flops()


class MfuMeter:
    """Turns (tokens, seconds) into achieved TFLOP/s and MFU for one rank."""

    def __init__(self, flops_per_token: float | None, peak_flops: float | None) -> None:
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops

    def compute(self, tokens: int | None, seconds: float) -> tuple[float | None, float | None]:
        if not tokens or not self.flops_per_token or seconds <= 0:
            return None, None
        achieved = self.flops_per_token * tokens / seconds
        mfu = achieved / self.peak_flops if self.peak_flops else None
        return achieved / 1e12, mfu
