"""Absolute position encodings: fixed sinusoids (Vaswani et al. 2017, sec. 3.5), learned, and
learned factorized (row, column) embeddings within a (T/stride, stride) grid (the Sparse
Transformer's text/audio positions: Child et al. 2019, arXiv 1904.10509, section 5.3)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention.sinusoid import sinusoid_table

__all__ = [
    "sinusoid_table",
    "SinusoidalPositions",
    "LearnedPositions",
    "FactorizedPositions",
    "build_positions",
]


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


class FactorizedPositions(nn.Module):
    """Adds learned row and column embeddings to (B, T, D) embeddings: position ``t`` is row
    ``t // stride`` and column ``t % stride`` of a (ceil(max_len / stride), stride) grid, and gets
    ``rows[t // stride] + cols[t % stride]``."""

    n_tables = 2

    def __init__(self, dim: int, max_len: int, stride: int):
        super().__init__()
        if isinstance(stride, bool) or not isinstance(stride, int) or stride <= 0:
            raise ValueError(f"stride must be a positive integer, got {stride!r}")
        self.max_len, self.stride = max_len, stride
        self.rows = nn.Embedding(-(-max_len // stride), dim)
        self.cols = nn.Embedding(stride, dim)
        nn.init.normal_(self.rows.weight, std=0.02)
        nn.init.normal_(self.cols.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.max_len:
            raise ValueError(
                f"factorized positions cover {self.max_len} tokens, got positions up to {offset + t}"
            )
        pos = torch.arange(offset, offset + t, device=x.device)
        emb = self.rows(pos // self.stride) + self.cols(pos % self.stride)  # (T, D)
        return x + emb[None]


def build_positions(kind: str, dim: int, max_len: int, *, stride: int | None = None) -> nn.Module:
    """``kind``: "sinusoidal", "learned" or "factorized" (which needs ``stride``)."""
    kinds = ("factorized", "learned", "sinusoidal")
    if kind not in kinds:
        raise ValueError(f"positions must be one of {list(kinds)}, got {kind!r}")
    if kind == "factorized":
        if stride is None:
            raise ValueError("factorized positions need a stride (the grid's width)")
        return FactorizedPositions(dim, max_len, stride)
    return {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}[kind](dim, max_len)
