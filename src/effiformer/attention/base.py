"""The one attention interface every mechanism implements (see docs/design.md).

An attention module is an ``nn.Module`` whose ``forward`` has this signature::

    forward(x, *, kv=None, mask=None, state=None, positions=None) -> AttentionOutput

- ``x``: (B, Tq, D) hidden states the queries come from.
- ``kv``: (B, Tk, D) hidden states keys and values come from; ``None`` means ``x``
  (self-attention). Funnel's pooled-query layer passes the pooled state as ``x`` and the unpooled
  one as ``kv``; cross-attention passes the encoder output.
- ``mask``: :class:`AttentionMask` — causal flag and key padding. Queries are aligned to the *last*
  ``Tq`` key positions (query ``i`` sees key ``j`` iff ``j <= i + Tk - Tq`` when causal), which is
  what recurrent memory needs.
- ``state``: the mechanism's explicit recurrent state (Transformer-XL memory, Compressive memories,
  Adaptive-Span cache, a decoding cache), or ``None``. Never stored on the module.
- ``positions``: mechanism-specific positional inputs computed once per forward by the model and
  shared by layers (relative encodings, Funnel's position/segment structures), or ``None``.

It returns :class:`AttentionOutput`: the output (B, Tq, D), the new state, auxiliary losses by
name (added to the task loss by the trainer), and ``updates`` — tensors computed under
``no_grad`` that the trainer writes into buffers after the optimiser step (Routing's k-means).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["AttentionMask", "AttentionOutput", "check_attention_inputs", "dense_bool_mask"]


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see.

    causal: query ``i`` (of ``Tq``) sees key ``j`` (of ``Tk``) iff ``j <= i + (Tk - Tq)``.
    key_padding: (B, Tk) bool, ``True`` for real tokens, ``False`` for padding; or ``None``.
    """

    causal: bool = False
    key_padding: Tensor | None = None

    def to_bool(self, tq: int, tk: int, device: torch.device | None = None) -> Tensor | None:
        """Boolean keep-mask broadcastable to (B, H, Tq, Tk), or ``None`` if nothing is masked."""
        return dense_bool_mask(
            tq, tk, causal=self.causal, key_padding=self.key_padding, device=device
        )


def dense_bool_mask(
    tq: int,
    tk: int,
    *,
    causal: bool,
    key_padding: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor | None:
    """Keep-mask (True = attend) of shape (1 or B, 1, Tq, Tk); ``None`` when nothing is masked."""
    mask = None
    if causal:
        offset = tk - tq
        qi = torch.arange(tq, device=device)[:, None]
        kj = torch.arange(tk, device=device)[None, :]
        mask = (kj <= qi + offset)[None, None]  # (1, 1, Tq, Tk)
    if key_padding is not None:
        kp = key_padding[:, None, None, :].to(torch.bool)  # (B, 1, 1, Tk)
        mask = kp if mask is None else (mask & kp)
    return mask


@dataclass
class AttentionOutput:
    """What every attention module (and every block) returns.

    out: (B, Tq, D).
    state: the new explicit state (same structure the module accepts), or ``None``.
    aux: auxiliary losses by name, each a scalar tensor, added to the task loss.
    updates: tensors computed without gradient that the training loop applies to buffers after
        the optimiser step, keyed by the buffer's qualified name relative to the module.
    """

    out: Tensor
    state: Any = None
    aux: dict[str, Tensor] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)


def check_attention_inputs(
    x: Tensor, kv: Tensor | None, dim: int, mask: AttentionMask | None
) -> None:
    """Validate shapes at the attention boundary with errors that name the argument."""
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"attention input x must be (B, Tq, {dim}), got {tuple(x.shape)}")
    if kv is not None:
        if kv.dim() != 3 or kv.shape[-1] != dim or kv.shape[0] != x.shape[0]:
            raise ValueError(
                f"attention input kv must be (B={x.shape[0]}, Tk, {dim}), got {tuple(kv.shape)}"
            )
        if kv.dtype != x.dtype:
            raise ValueError(f"x and kv must share a dtype, got {x.dtype} and {kv.dtype}")
    tk = (kv if kv is not None else x).shape[1]
    if mask is not None and mask.key_padding is not None:
        kp = mask.key_padding
        if kp.shape != (x.shape[0], tk):
            raise ValueError(
                f"mask.key_padding must be (B={x.shape[0]}, Tk={tk}), got {tuple(kp.shape)}"
            )
    if mask is not None and mask.causal and tk < x.shape[1]:
        raise ValueError(f"causal attention needs Tk >= Tq, got Tq={x.shape[1]}, Tk={tk}")
