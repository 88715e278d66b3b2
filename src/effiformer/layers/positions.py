"""Absolute position encodings: fixed sinusoids (Vaswani et al. 2017, sec. 3.5), learned,
learned factorized (row, column) embeddings within a (T/stride, stride) grid (the Sparse
Transformer's text/audio positions: Child et al. 2019, arXiv 1904.10509, section 5.3), and the
Reformer's axial encodings (Kitaev et al. 2020, arXiv 2001.04451, sec. 5; trax
``AxialPositionalEncoding``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention.sinusoid import sinusoid_table

__all__ = [
    "sinusoid_table",
    "SinusoidalPositions",
    "LearnedPositions",
    "FactorizedPositions",
    "AxialPositions",
    "NoPositions",
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


class NoPositions(nn.Module):
    """No absolute positions: (B, T, D) embeddings unchanged. For attention that carries its own
    (the Routing Transformer's released models: relative positions only, ``add_timing_signal``
    False)."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x


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


class AxialPositions(nn.Module):
    """Adds axial position encodings to (B, T, D) embeddings (trax's default: concatenated).

    The positions ``0 .. n1*n2 - 1`` are laid out on an (n1, n2) grid; position ``p`` gets
    ``concat(E1[p // n2], E2[p % n2])`` with learned E1: (n1, d1), E2: (n2, d2), d1 + d2 = D,
    initialised N(0, 1) (trax ``RandomNormalInitializer(1.0)``). Parameters: n1*d1 + n2*d2
    instead of n1*n2*D. ``dropout``: trax drops features of the encoding with one mask per
    example, shared by every position (``dropout_broadcast_dims`` over the grid axes).
    Inputs shorter than n1*n2 take the first T positions (trax needs exactly n1*n2 in training).
    """

    def __init__(
        self, dim: int, shape: tuple[int, int], dims: tuple[int, int], *, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if len(shape) != 2 or len(dims) != 2 or any(int(v) < 1 for v in (*shape, *dims)):
            raise ValueError(
                f"axial shape and dims must be two positive ints each, got {shape}, {dims}"
            )
        if sum(dims) != dim:
            raise ValueError(f"axial dims must sum to dim={dim}, got {dims} (sum {sum(dims)})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.shape, self.dims, self.dropout = tuple(shape), tuple(dims), dropout
        self.max_len = shape[0] * shape[1]
        self.e1 = nn.Parameter(torch.randn(shape[0], dims[0]))
        self.e2 = nn.Parameter(torch.randn(shape[1], dims[1]))

    def encoding(self, positions: Tensor) -> Tensor:
        """(T,) positions -> (T, D) encodings."""
        n2 = self.shape[1]
        return torch.cat([self.e1[positions // n2], self.e2[positions % n2]], dim=-1)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.max_len:
            raise ValueError(
                f"axial positions cover {self.max_len} = {self.shape[0]}x{self.shape[1]} tokens, "
                f"got positions up to {offset + t}"
            )
        pos = torch.arange(offset, offset + t, device=x.device)
        enc = self.encoding(pos).to(x.dtype)[None]  # (1, T, D)
        if self.training and self.dropout > 0:
            keep = torch.rand(x.shape[0], 1, x.shape[2], device=x.device) >= self.dropout
            enc = enc * keep.to(x.dtype) / (1.0 - self.dropout)  # (B, T, D)
        return x + enc


def build_positions(kind: str, dim: int, max_len: int, *, stride: int | None = None) -> nn.Module:
    """``kind``: "sinusoidal", "learned", "factorized" (which needs ``stride``) or "none"."""
    kinds = ("factorized", "learned", "sinusoidal", "none")
    if kind not in kinds:
        raise ValueError(f"positions must be one of {list(kinds)}, got {kind!r}")
    if kind == "factorized":
        if stride is None:
            raise ValueError("factorized positions need a stride (the grid's width)")
        return FactorizedPositions(dim, max_len, stride)
    if kind == "none":
        return NoPositions()
    return {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}[kind](dim, max_len)
