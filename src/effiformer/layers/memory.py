"""Memory (FIFO) updates for segment-level recurrence.

Transformer-XL (Dai et al. 2019, arXiv 1901.02860, sec. 3.2, eq. for h~_{tau+1}^{n-1}): the
memory of layer n for the next segment is the last ``mem_len`` states of
``concat(old memory, this segment's input to layer n)``, wrapped in stop-gradient.

Compressive Transformer (Rae et al. 2019, arXiv 1911.05507, Algorithm 1): the same FIFO, but the
states pushed out of the front (``old_mem``) are handed to the compression function instead of
being discarded.

Deviation from the official code: ``_update_mems`` in kimiyoung/transformer-xl (and the HF ports)
is called with ``qlen`` and ``mlen`` swapped (issues #59, #118; HF #2970, #3580); it is harmless
only because ``ext_len`` is 0. We have no ``ext_len`` and simply keep the last ``mem_len`` rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["update_memory", "push_and_evict"]


def _check(mem: Tensor, h: Tensor) -> None:
    if mem.dim() != 3 or h.dim() != 3 or mem.shape[0] != h.shape[0] or mem.shape[2] != h.shape[2]:
        raise ValueError(
            f"memory (B, M, D) and states (B, T, D) must agree in B and D, got "
            f"{tuple(mem.shape)} and {tuple(h.shape)}"
        )


def update_memory(mem: Tensor, h: Tensor, mem_len: int) -> Tensor:
    """Next memory: last ``mem_len`` rows of ``concat(mem, h)``, detached.

    mem: (B, M, D) (M may be 0); h: (B, T, D) -> (B, min(mem_len, M + T), D).
    """
    _check(mem, h)
    if mem_len < 0:
        raise ValueError(f"mem_len must be >= 0, got {mem_len}")
    cat = h if mem.shape[1] == 0 else _cat(mem, h)  # (B, M + T, D)
    start = max(0, cat.shape[1] - mem_len)
    return cat[:, start:].detach()


def push_and_evict(mem: Tensor, h: Tensor, mem_len: int) -> tuple[Tensor, Tensor]:
    """FIFO push of ``h`` into ``mem`` keeping ``mem_len`` rows, both results detached.

    mem: (B, M, D); h: (B, T, D) -> (new memory (B, min(mem_len, M+T), D),
    evicted (B, max(0, M + T - mem_len), D)), the evicted rows oldest first.
    """
    _check(mem, h)
    if mem_len < 0:
        raise ValueError(f"mem_len must be >= 0, got {mem_len}")
    cat = _cat(mem, h).detach()  # (B, M + T, D)
    split = max(0, cat.shape[1] - mem_len)
    return cat[:, split:], cat[:, :split]


def _cat(a: Tensor, b: Tensor) -> Tensor:
    return torch.cat([a, b], dim=1)  # (B, Ta + Tb, D)
