"""Compression functions f_c of the Compressive Transformer.

Rae, Potapenko, Jayakumar, Hillier, Lillicrap 2019, "Compressive Transformers for Long-Range
Sequence Modelling", arXiv 1911.05507, sec. 3.1 ("Choice of compression functions"): f_c maps the
``n_s`` states evicted from the memory to ``floor(n_s / c)`` compressed states, with

- ``max`` / ``mean``: max or mean pooling with kernel = stride = c;
- ``conv``: a 1-D convolution with kernel = stride = c (the paper's best, and our default);
- ``dilated_conv``: a dilated 1-D convolution;
- ``most_used``: keep the memories that received the most attention, in their temporal order.

Every f_c here maps ``old_mem`` (B, N, D) to (B, N // c, D). Deliberate choices, not fixed by
the paper:

- When ``N`` is not a multiple of ``c`` (the paper assumes it is) the oldest ``N mod c`` evicted
  states are dropped, so compressed slots align with the most recent eviction boundary (the
  lucidrains reimplementation instead zero-pads the evicted block on the left).
- ``dilated_conv`` (the paper gives no kernel or dilation): a WaveNet-style stack of
  ``ceil(log2 c)`` causal convolutions with kernel 2 and dilations 1, 2, 4, ..., then the output
  at the last state of every group of ``c``. Each compressed slot's receptive field (``2^L >= c``
  states) covers its whole group (exactly, when ``c`` is a power of two); linear, like ``conv``.
- ``most_used``: "usage" is the attention weight a slot received (summed over heads and queries)
  in the last segment it sat in the memory; :class:`~effiformer.models.compressive.Compressive`
  computes it with the layer's own attention weights. Ties keep the older slot.
- Convolutions use PyTorch's default initialisation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "COMPRESSIONS",
    "Compression",
    "ConvCompression",
    "DilatedConvCompression",
    "MaxPoolCompression",
    "MeanPoolCompression",
    "MostUsedCompression",
    "build_compression",
]


class Compression(nn.Module):
    """Base: ``forward(old_mem (B, N, D), usage (B, N) | None) -> (B, N // rate, D)``."""

    needs_usage = False

    def __init__(self, rate: int) -> None:
        super().__init__()
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
            raise ValueError(f"compression rate must be a positive int, got {rate!r}")
        self.rate = rate

    def _aligned(self, old_mem: Tensor) -> Tensor:
        if old_mem.dim() != 3:
            raise ValueError(f"old_mem must be (B, N, D), got {tuple(old_mem.shape)}")
        r = old_mem.shape[1] % self.rate
        return old_mem[:, r:]  # (B, N - N mod c, D): drop the oldest remainder

    def forward(self, old_mem: Tensor, usage: Tensor | None = None) -> Tensor:
        x = self._aligned(old_mem)
        if usage is not None and usage.shape != old_mem.shape[:2]:
            raise ValueError(
                f"usage must be (B, N)={tuple(old_mem.shape[:2])}, got {tuple(usage.shape)}"
            )
        if x.shape[1] == 0:
            return x
        return self._compress(x, usage)

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        raise NotImplementedError


class MeanPoolCompression(Compression):
    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        y = F.avg_pool1d(x.transpose(1, 2), self.rate, self.rate)  # (B, D, N/c)
        return y.transpose(1, 2)  # (B, N/c, D)


class MaxPoolCompression(Compression):
    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        y = F.max_pool1d(x.transpose(1, 2), self.rate, self.rate)  # (B, D, N/c)
        return y.transpose(1, 2)  # (B, N/c, D)


class ConvCompression(Compression):
    def __init__(self, dim: int, rate: int) -> None:
        super().__init__(rate)
        self.conv = nn.Conv1d(dim, dim, kernel_size=rate, stride=rate)

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, D, N/c) -> (B, N/c, D)


class DilatedConvCompression(Compression):
    def __init__(self, dim: int, rate: int) -> None:
        super().__init__(rate)
        n_layers = math.ceil(math.log2(rate)) if rate > 1 else 0
        self.dilations = [2**i for i in range(n_layers)]
        self.convs = nn.ModuleList(
            nn.Conv1d(dim, dim, kernel_size=2, dilation=d) for d in self.dilations
        )

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        y = x.transpose(1, 2)  # (B, D, N)
        for d, conv in zip(self.dilations, self.convs):
            y = conv(F.pad(y, (d, 0)))  # causal: (B, D, N)
        return y[:, :, self.rate - 1 :: self.rate].transpose(1, 2)  # (B, N/c, D)


class MostUsedCompression(Compression):
    needs_usage = True

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        if usage is None:
            raise ValueError("most_used compression needs usage (B, N): attention per slot")
        usage = usage[:, usage.shape[1] - x.shape[1] :]  # (B, N'): drop the same remainder
        n_keep = x.shape[1] // self.rate
        # Stable descending sort keeps the older slot on ties; re-sort the kept indices by time.
        order = torch.sort(usage, dim=1, descending=True, stable=True).indices[:, :n_keep]
        idx = torch.sort(order, dim=1).values  # (B, N/c)
        return torch.gather(x, 1, idx[:, :, None].expand(-1, -1, x.shape[2]))  # (B, N/c, D)


COMPRESSIONS = ("conv", "max", "mean", "dilated_conv", "most_used")


def build_compression(kind: str, dim: int, rate: int) -> Compression:
    """A per-layer f_c by name (one of :data:`COMPRESSIONS`)."""
    if kind == "conv":
        return ConvCompression(dim, rate)
    if kind == "dilated_conv":
        return DilatedConvCompression(dim, rate)
    if kind == "mean":
        return MeanPoolCompression(rate)
    if kind == "max":
        return MaxPoolCompression(rate)
    if kind == "most_used":
        return MostUsedCompression(rate)
    raise ValueError(f"compression must be one of {list(COMPRESSIONS)}, got {kind!r}")
