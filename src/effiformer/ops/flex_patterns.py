"""Attention patterns through FlexAttention (``torch.nn.attention.flex_attention``), on the ops
floor: the device backend of the patterns a mask can express (local windows, the Sparse
Transformer's strided and fixed patterns). A mechanism gives the pattern as a ``mask_mod``
(``(b, h, q_idx, kv_idx) -> bool``: True = the query sees the key); this module builds its block
mask (the blocks with no visible pair are skipped, which is where the speed comes from) and runs
one compiled ``flex_attention``, compiled once per shape.

On CUDA FlexAttention has a forward and a backward: the patterns train through it. On this CPU
(torch 2.13) it runs only compiled and only forward, so CPU training keeps the mechanisms' own
kernels (:mod:`.tiled_sparse`, :mod:`.strided_local`); the CPU path here serves inference and the
tests that check the masks against those kernels.

    why = flex_unavailable(q, needs_grad=torch.is_grad_enabled())   # None: it can run
    mask = pattern_block_mask(mask_mod, B, H, T, T, device)          # once per forward
    out = flex_pattern_attention(q, k, v, mask)                      # (B, H, T, Dh)

A query that sees no key gets a zero output (FlexAttention's convention for an empty row).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["flex_pattern_attention", "flex_unavailable", "masked_mod", "pattern_block_mask"]

_compiled: Any = None


def _flex() -> Any:
    try:
        from torch.nn.attention import flex_attention
    except ImportError:  # pragma: no cover - every torch this project supports has it
        return None
    return flex_attention


def flex_unavailable(q: Tensor, *, needs_grad: bool) -> str | None:
    """Why FlexAttention cannot run this call (``None`` when it can): its module missing, a
    device it does not run on, or a backward on the CPU (torch 2.13 has none there)."""
    if _flex() is None:
        return "this torch has no torch.nn.attention.flex_attention"
    if q.device.type not in ("cpu", "cuda"):
        return f"FlexAttention does not run on {q.device.type}"
    if q.device.type == "cpu" and needs_grad and q.requires_grad:
        return "FlexAttention has no backward on the CPU (torch 2.13): train with the CPU kernels"
    return None


def masked_mod(
    pattern: Callable[..., Tensor], *, causal: bool, key_padding: Tensor | None = None
) -> Callable[..., Tensor]:
    """A pattern's ``mask_mod`` with what every pattern shares added: the causal mask (a key
    after its query is never seen) and key padding (``key_padding`` (B, Tk) bool, True = real)."""
    kp = None if key_padding is None else key_padding.to(torch.bool)

    def mask_mod(b, h, q_idx, kv_idx):
        keep = pattern(b, h, q_idx, kv_idx)
        if causal:
            keep = keep & (kv_idx <= q_idx)
        if kp is not None:
            keep = keep & kp[b, kv_idx]
        return keep

    return mask_mod


def pattern_block_mask(
    mask_mod: Callable[..., Tensor],
    batch: int | None,
    heads: int | None,
    tq: int,
    tk: int,
    device: torch.device | str,
) -> Any:
    """The ``BlockMask`` of ``mask_mod`` for (batch, heads, tq, tk) (``None`` batch / heads:
    the same for every row / head). On CUDA it is built compiled (no (tq, tk) tensor is
    materialised); on the CPU by evaluating the mask (test sizes)."""
    fa = _flex()
    dev = torch.device(device)
    return fa.create_block_mask(
        mask_mod, batch, heads, tq, tk, device=dev, _compile=dev.type == "cuda"
    )


def flex_pattern_attention(
    q: Tensor, k: Tensor, v: Tensor, block_mask: Any, *, scale: float | None = None
) -> Tensor:
    """Attention of q (B, H, Tq, Dh) over k, v (B, H, Tk, Dh) restricted to ``block_mask``
    -> (B, H, Tq, Dh), through one ``torch.compile``d ``flex_attention``."""
    global _compiled
    why = flex_unavailable(q, needs_grad=torch.is_grad_enabled())
    if why is not None:
        raise ValueError(f"FlexAttention cannot take this call: {why}")
    if _compiled is None:
        _compiled = torch.compile(_flex().flex_attention, dynamic=False)
    return _compiled(q, k, v, block_mask=block_mask, scale=scale)
