"""Sequence pooling and upsampling for Funnel-Transformer.

Dai, Lai, Yang, Le 2020, "Funnel-Transformer: Filtering out Sequential Redundancy for Efficient
Language Processing", arXiv 2006.03236, sec. 2.2 (pooling, window = stride = 2) and sec. 2.3
(decoder upsampling by repetition). Semantics follow the official code
(laiguokun/Funnel-Transformer, ``pytorch/ops.py``):

- ``separate_cls``: token 0 ([CLS]) is kept out of the pooling and put back at the front.
- ``truncate_seq`` (only meaningful with ``separate_cls``): the last token is dropped before
  pooling, so lengths go 512 -> 256 -> 128. Next length ``1 + ceil((n - 2) / 2)``; without
  truncation ``1 + ceil((n - 1) / 2)``; without ``separate_cls`` ``ceil(n / 2)``.
- A trailing odd token forms a window of its own (ceil / SAME padding).
- Hidden states are pooled with mean or max. Side structures are *stride-sliced* (the first token
  of every window is kept), never averaged: position ids, the same-segment matrix and the
  cls-mask. The pooled [CLS] gets position ``1 - 2**b`` in block ``b`` (``stride_pool_pos``), so
  pooled positions stay evenly spaced with stride ``2**b``.
- The padding mask is pooled with ``min`` over an *is-padding* indicator, the official polarity
  (``input_mask`` = 1 marks padding): a pooled slot is padding only when **both** tokens of its
  window are padding. HF transformers pools the keep-mask (1 = real token) with ``min`` instead,
  which masks a slot as soon as **either** token is padding; the two differ exactly where a window
  straddles the padding boundary. effiformer follows the official code.

Deliberate deviation: the official code writes the [CLS]-separate pooling as "prepend [CLS] again
and pool pairs"; here [CLS] is kept and the remaining tokens are pooled in pairs, which gives the
same values (the mean or max of [CLS] with itself is [CLS]).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "POOLING_MODES",
    "pooled_length",
    "pool_sequence",
    "stride_slice",
    "pool_positions",
    "pool_progression",
    "pool_padding",
    "upsample",
]

POOLING_MODES = ("mean", "max", "min")


def pooled_length(n: int, *, separate_cls: bool = True, truncate_seq: bool = True) -> int:
    """Length after one pooling step of a length-``n`` sequence."""
    if n < 1:
        raise ValueError(f"sequence length must be >= 1, got {n}")
    if separate_cls:
        rest = n - 2 if truncate_seq else n - 1
        return 1 + math.ceil(max(rest, 0) / 2)
    return math.ceil(n / 2)


def _pairs(x: Tensor, mode: str) -> Tensor:
    """Pool dim 1 of x (B, n, ...) in windows of 2 with a last window of 1 when n is odd."""
    n = x.shape[1]
    even = n - n % 2
    body = x[:, :even].reshape(x.shape[0], even // 2, 2, *x.shape[2:])  # (B, n/2, 2, ...)
    if mode == "mean":
        out = body.mean(dim=2)
    elif mode == "max":
        out = body.amax(dim=2)
    else:
        out = body.amin(dim=2)
    if n % 2:
        out = torch.cat([out, x[:, even:]], dim=1)
    return out


def pool_sequence(
    x: Tensor, mode: str = "mean", *, separate_cls: bool = True, truncate_seq: bool = True
) -> Tensor:
    """Pool x (B, T, ...) along dim 1 with window = stride = 2 -> (B, pooled_length(T), ...).

    ``mode``: "mean" or "max" for hidden states, "min" for indicator masks.
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling mode must be one of {list(POOLING_MODES)}, got {mode!r}")
    if x.dim() < 2:
        raise ValueError(f"pool_sequence expects (B, T, ...), got shape {tuple(x.shape)}")
    if not separate_cls:
        return _pairs(x, mode)
    rest = x[:, 1:-1] if truncate_seq else x[:, 1:]
    if rest.shape[1] == 0:
        return x[:, :1]
    return torch.cat([x[:, :1], _pairs(rest, mode)], dim=1)


def stride_slice(
    x: Tensor, dim: int, *, separate_cls: bool = True, truncate_seq: bool = True
) -> Tensor:
    """Keep the first element of every pooling window along ``dim`` (and [CLS] separately)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    if not separate_cls:
        idx = torch.arange(0, n, 2)
    else:
        end = n - 1 if truncate_seq else n
        idx = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, max(end, 1), 2)])
    return x.index_select(dim, idx.to(x.device))


def pool_positions(
    pos: Tensor, block_index: int, *, separate_cls: bool = True, truncate_seq: bool = True
) -> Tensor:
    """Positions (T,) of block ``block_index - 1`` -> positions of block ``block_index``.

    Stride-sliced; with ``separate_cls`` the pooled [CLS] is placed at ``1 - 2**block_index``
    (one stride before position 1, where the first real window starts), keeping the positions
    evenly spaced as the relative-shift form needs.
    """
    if block_index < 1:
        raise ValueError(f"block_index must be >= 1 for a pooled block, got {block_index}")
    out = stride_slice(pos, 0, separate_cls=separate_cls, truncate_seq=truncate_seq)
    if separate_cls:
        out = out.clone()
        out[0] = 1 - 2**block_index
    return out


def pool_progression(
    first: int,
    step: int,
    n: int,
    block_index: int,
    *,
    separate_cls: bool = True,
    truncate_seq: bool = True,
) -> tuple[int, int, int]:
    """:func:`pool_positions` on integers: positions ``first + i * step`` (i < n) of block
    ``block_index - 1`` -> ``(first, step, n)`` of block ``block_index``. Funnel's positions are
    evenly spaced at every block (the pooled [CLS] one stride before position 1), so three
    integers describe them and the relative-position tables need no tensor read (one graph under
    ``torch.compile``)."""
    if block_index < 1:
        raise ValueError(f"block_index must be >= 1 for a pooled block, got {block_index}")
    if not separate_cls:
        return first, 2 * step, -(-n // 2)
    end = n - 1 if truncate_seq else n
    rest = len(range(1, max(end, 1), 2))
    return 1 - 2**block_index, 2 * step, 1 + rest


def pool_padding(
    key_padding: Tensor | None, *, separate_cls: bool = True, truncate_seq: bool = True
) -> Tensor | None:
    """Pool a keep-mask (B, T) bool (True = real token) with the official polarity.

    The official code min-pools ``is_pad`` (1 = padding), so a pooled slot is padding only when
    both of its tokens are padding; on the keep-mask that is a max (logical or).
    """
    if key_padding is None:
        return None
    is_pad = (~key_padding.to(torch.bool)).to(torch.uint8)
    pooled = pool_sequence(is_pad, "min", separate_cls=separate_cls, truncate_seq=truncate_seq)
    return pooled == 0


def upsample(
    x: Tensor, stride: int, target_len: int, *, separate_cls: bool = True, truncate_seq: bool = True
) -> Tensor:
    """Repeat each position of x (B, T', D) ``stride`` times -> (B, target_len, D).

    With ``separate_cls`` the [CLS] slot is kept once at the front; with ``truncate_seq`` the
    positions dropped by truncation are filled with zeros (the official code pads ``stride - 1``
    positions before cutting to length).
    """
    if stride == 1:
        return x
    if not separate_cls:
        return torch.repeat_interleave(x, stride, dim=1)[:, :target_len]
    cls, rest = x[:, :1], x[:, 1:]
    up = torch.repeat_interleave(rest, stride, dim=1)  # (B, (T'-1)*stride, D)
    if truncate_seq:
        up = torch.nn.functional.pad(up, (0, 0, 0, stride - 1))
    up = up[:, : target_len - 1]
    if up.shape[1] < target_len - 1:
        pad = target_len - 1 - up.shape[1]
        up = torch.nn.functional.pad(up, (0, 0, 0, pad))
    return torch.cat([cls, up], dim=1)
