"""A small decoder-only transformer (GPT style), laid out for TP and PP splitting.

Attention projections are separate (`wq`, `wk`, `wv`) so column-wise TP shards whole heads, and
the layers live in a ModuleDict keyed by their global index so parameter names stay the same
whatever pipeline stage holds them (checkpoints reshard by name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelArgs:
    vocab: int = 256
    dim: int = 64
    layers: int = 4
    heads: int = 4
    seq: int = 32
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class Attention(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.head_dim = a.head_dim
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # With TP the projections hold only this rank's heads: -1 is the local head count.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.mlp_ratio * a.dim, bias=False)
        self.w2 = nn.Linear(a.mlp_ratio * a.dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(a.dim)
        self.attn = Attention(a)
        self.ffn_norm = nn.LayerNorm(a.dim)
        self.ffn = FeedForward(a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """Embedding, blocks and head are optional so a pipeline stage can drop what it doesn't run."""

    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.args = a
        self.tok_emb: nn.Embedding | None = nn.Embedding(a.vocab, a.dim)
        self.pos_emb: nn.Embedding | None = nn.Embedding(a.seq, a.dim)
        self.layers = nn.ModuleDict({str(i): Block(a) for i in range(a.layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(a.dim)
        self.head: nn.Linear | None = nn.Linear(a.dim, a.vocab, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue
            scale = (
                1 / math.sqrt(2 * self.args.layers)
                if name.endswith(("wo.weight", "w2.weight"))
                else 1.0
            )
            nn.init.normal_(p, mean=0.0, std=std * scale)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None and self.pos_emb is not None:
            pos = torch.arange(h.shape[1], device=h.device)
            h = self.tok_emb(h) + self.pos_emb(pos)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None and self.head is not None:
            h = self.head(self.norm(h))
        return h


def keep_stage(model: Transformer, stage: int, stages: int) -> Transformer:
    """Prune `model` in place to pipeline stage `stage` of `stages` (contiguous layer ranges)."""
    n = model.args.layers
    lo, hi = stage * n // stages, (stage + 1) * n // stages
    for i in range(n):
        if not lo <= i < hi:
            del model.layers[str(i)]
    if stage != 0:
        model.tok_emb = None
        model.pos_emb = None
    if stage != stages - 1:
        model.norm = None
        model.head = None
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
