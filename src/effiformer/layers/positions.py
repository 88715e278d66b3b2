"""Absolute position encodings: fixed sinusoids (Vaswani et al. 2017, sec. 3.5) and learned."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention.sinusoid import sinusoid_table

__all__ = ["sinusoid_table", "SinusoidalPositions", "LearnedPositions", "build_positions"]


class SinusoidalPositions(nn.Module):
    """Adds fixed sinusoids to (B, T, D) embeddings; no parameters."""

    def __init__(self, dim: int, max_len: int):
        super().__init__()
        self.dim, self.max_len = dim, max_len

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        pos = torch.arange(offset, offset + t, device=x.device)
        return x + sinusoid_table(pos, self.dim).to(x.dtype)[None]


class LearnedPositions(nn.Module):
    """Adds a learned (max_len, D) table to (B, T, D) embeddings."""

    def __init__(self, dim: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, dim)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.max_len:
            raise ValueError(
                f"learned positions cover {self.max_len} tokens, got positions up to {offset + t}"
            )
        return x + self.table.weight[offset : offset + t][None]


def build_positions(kind: str, dim: int, max_len: int) -> nn.Module:
    kinds = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}
    if kind not in kinds:
        raise ValueError(f"positions must be one of {sorted(kinds)}, got {kind!r}")
    return kinds[kind](dim, max_len)
