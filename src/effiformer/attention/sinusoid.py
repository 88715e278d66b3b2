"""Fixed sinusoid tables (Vaswani et al. 2017, sec. 3.5), shared by absolute and relative
position encodings."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sinusoid_table"]


def sinusoid_table(positions: Tensor, dim: int) -> Tensor:
    """(T,) float positions -> (T, dim) table ``[sin(p w_k) | cos(p w_k)]``, w_k = 10000^(-2k/dim).

    The [sin|cos] concatenated layout is the one Transformer-XL and Funnel use for R.
    """
    if dim % 2:
        raise ValueError(f"sinusoid dim must be even, got {dim}")
    inv_freq = 1.0 / (
        10000 ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    )
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
