"""Blocked local attention read in place: the kernel of the local heads (the Reformer's local
layers, the Routing Transformer's local heads), on the ops floor.

Each chunk's neighbourhood is one contiguous range of positions (clipped at the ends), so its
keys and values are a window of the (B, T, H, Dh) tensor itself: an overlapping strided view
instead of a gathered (chunks, K) copy. The CPU flash-attention kernel that
``F.scaled_dot_product_attention`` runs reads such views in place; calling its forward and
backward directly, the autograd node keeps q, k, v (the caller's tensors), the output and the
log-sum-exp only, and the backward recomputes the scores block by block as SDPA's own backward
does (same kernel, same FLOPs; the neighbour gradients are folded back group by group).

    out = strided_local_attention(q, k, v, window=w, length=T, back=1, fwd=0, causal=True)

What a chunk sees (the window, its neighbours, the causal mask on positions) is the mechanism's
(:mod:`effiformer.attention.local`); :func:`strided_unavailable` says why a call cannot run here
(the gathered path then takes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .flash_cpu import flash_backward, flash_forward, flash_unavailable

__all__ = ["STRIDED_DTYPES", "strided_local_attention", "strided_unavailable"]

#: dtypes the strided path takes (the kernel's log-sum-exp is float32 for lower precisions,
#: which the in-place folding does not handle)
STRIDED_DTYPES = (torch.float32, torch.float64)


def strided_unavailable(
    q: Tensor, *, dropout_p: float = 0.0, key_padding: Tensor | None = None
) -> str | None:
    """Why the strided path (local or routed) cannot take this call, or ``None`` when it can
    (the kernel's own reasons, :func:`~effiformer.ops.flash_unavailable`, then the path's)."""
    why = flash_unavailable(q, dropout_p=dropout_p, dtypes=STRIDED_DTYPES)
    if why is not None:
        return why
    if key_padding is not None:
        return "key padding needs a per-row mask (the gathered path builds it)"
    return None


def _blocks(x: Tensor, bi: int, start: int, m: int, step: int, length: int) -> Tensor:
    """(B, T, H, Dh) -> (m, H, length, Dh) view of batch row ``bi``: ``m`` windows of ``length``
    rows starting at ``start, start + step, ...`` (overlapping when ``length > step``)."""
    sb, st, sh, sd = x.stride()
    return x.as_strided(
        (m, x.shape[2], length, x.shape[3]),
        (step * st, sh, st, sd),
        x.storage_offset() + bi * sb + start * st,
    )


@dataclass(frozen=True)
class _Segment:
    """``m`` consecutive chunks whose queries (``q_len`` rows each from row ``q0``, one chunk
    apart) see keys ``k_len`` rows from row ``k0`` (one chunk apart) under one mask."""

    q0: int
    k0: int
    m: int
    q_len: int
    k_len: int
    mask: Tensor | None  # (q_len, k_len) additive float mask, None: every key visible


def _segments(
    w: int, t: int, back: int, fwd: int, causal: bool, dtype: torch.dtype, device
) -> list[_Segment]:
    """The chunks of ``w`` tokens of a length-``t`` sequence, each seeing ``back`` chunks before
    it and ``fwd`` after it, as segments: chunks whose neighbourhood lies inside [0, T) share
    one relative mask and go in groups; the chunks at either end go one by one, their key range
    clipped to [0, T) (a missing or padded neighbour is a masked one; so is, under the causal
    mask, a later chunk)."""
    n = -(-t // w)
    ahead = 0 if causal else fwd

    def mask(q0: int, q_len: int, k0: int, k_len: int) -> Tensor | None:
        if not causal:
            return None
        qpos = torch.arange(q0, q0 + q_len, device=device)
        kpos = torch.arange(k0, k0 + k_len, device=device)
        keep = kpos[None, :] <= qpos[:, None]  # (q_len, k_len)
        return torch.zeros(q_len, k_len, dtype=dtype, device=device).masked_fill(
            ~keep, float("-inf")
        )

    def single(c: int) -> _Segment:
        q0, q1 = c * w, min(t, (c + 1) * w)
        k0, k1 = max(0, (c - back) * w), min(t, (c + 1 + ahead) * w)
        return _Segment(q0, k0, 1, q1 - q0, k1 - k0, mask(q0, q1 - q0, k0, k1 - k0))

    lo, hi = back, n  # full chunks: neighbours in range and not padded
    while hi > lo and (hi + ahead) * w > t:
        hi -= 1
    segs = [single(c) for c in range(min(lo, n))]
    if hi > lo:
        k_len = (back + 1 + ahead) * w
        rel = mask(lo * w, w, (lo - back) * w, k_len)  # the same for every full chunk
        group = max(8, -(-(hi - lo) // 8))  # about 8 groups: bounded backward transients
        for c0 in range(lo, hi, group):
            m = min(group, hi - c0)
            segs.append(_Segment(c0 * w, (c0 - back) * w, m, w, k_len, rel))
    segs += [single(c) for c in range(max(hi, lo), n)]
    return segs


# The forward and the backward are registered operators (``torch.library.custom_op``) with fake
# implementations and a registered autograd formula: ``torch.compile`` and ``torch.export`` see
# one opaque op per call instead of tracing the strided views (no graph break).


@torch.library.custom_op("effiformer::strided_local_forward", mutates_args=())
def _forward_op(
    q: Tensor, k: Tensor, v: Tensor, window: int, back: int, fwd: int, causal: bool,
    scale: float | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(B, T, H, Dh) x 3 -> out (B, T, H, Dh), lse (B, T, H)."""
    b, t, h, dh = q.shape
    segs = _segments(window, t, back, fwd, causal, q.dtype, q.device)
    out = q.new_empty(b, t, h, dh)  # (B, T, H, Dh)
    lse = q.new_empty(b, t, h)  # (B, T, H): the kernel's own (rows, heads) layout
    for bi in range(b):
        for s in segs:
            o, lg = flash_forward(
                _blocks(q, bi, s.q0, s.m, s.q_len, s.q_len),
                _blocks(k, bi, s.k0, s.m, s.q_len, s.k_len),
                _blocks(v, bi, s.k0, s.m, s.q_len, s.k_len),
                0.0,
                False,
                attn_mask=s.mask,
                scale=scale,
            )  # (m, H, q_len, Dh), (m, H, q_len)
            _blocks(out, bi, s.q0, s.m, s.q_len, s.q_len).copy_(o)
            _rows(lse, bi, s).copy_(lg)
    return out, lse


@_forward_op.register_fake
def _(q, k, v, window, back, fwd, causal, scale):
    b, t, h, dh = q.shape
    return q.new_empty(b, t, h, dh), q.new_empty(b, t, h)


@torch.library.custom_op("effiformer::strided_local_backward", mutates_args=())
def _backward_op(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, window: int,
    back: int, fwd: int, causal: bool, scale: float | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The forward's gradient with respect to q, k, v (each (B, T, H, Dh), contiguous)."""
    if grad.stride(-1) != 1:
        grad = grad.contiguous()
    b, t = q.shape[:2]
    segs = _segments(window, t, back, fwd, causal, q.dtype, q.device)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.zeros_like(k, memory_format=torch.contiguous_format)
    dv = torch.zeros_like(v, memory_format=torch.contiguous_format)
    for bi in range(b):
        for s in segs:
            gq, gk, gv = flash_backward(
                _blocks(grad, bi, s.q0, s.m, s.q_len, s.q_len),
                _blocks(q, bi, s.q0, s.m, s.q_len, s.q_len),
                _blocks(k, bi, s.k0, s.m, s.q_len, s.k_len),
                _blocks(v, bi, s.k0, s.m, s.q_len, s.k_len),
                _blocks(out, bi, s.q0, s.m, s.q_len, s.q_len),
                _rows(lse, bi, s),
                0.0,
                False,
                attn_mask=s.mask,
                scale=scale,
            )  # (m, H, q_len, Dh), (m, H, k_len, Dh) x 2
            _blocks(dq, bi, s.q0, s.m, s.q_len, s.q_len).copy_(gq)
            # fold the windows back: one chunk-wide slice at a time (disjoint across m)
            step = s.q_len if s.m > 1 else s.k_len
            for j in range(0, s.k_len, step):
                piece = min(step, s.k_len - j)
                _blocks(dk, bi, s.k0 + j, s.m, s.q_len, piece).add_(gk[:, :, j : j + piece])
                _blocks(dv, bi, s.k0 + j, s.m, s.q_len, piece).add_(gv[:, :, j : j + piece])
            del gq, gk, gv
    return dq, dk, dv


@_backward_op.register_fake
def _(grad, q, k, v, out, lse, window, back, fwd, causal, scale):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = args


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _backward_op(grad_out, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def _rows(lse: Tensor, bi: int, s: _Segment) -> Tensor:
    """(B, T, H) -> (m, H, q_len) view of the segment's query rows."""
    rows = lse[bi, s.q0 : s.q0 + s.m * s.q_len]  # (m * q_len, H)
    return rows.view(s.m, s.q_len, lse.shape[2]).transpose(1, 2)


def strided_local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    back: int,
    fwd: int,
    causal: bool,
    scale: float | None = None,
) -> Tensor:
    """Local attention over (B, T, H, Dh) q, k, v -> (B, T, H, Dh): the queries of each chunk of
    ``window`` tokens attend to the keys of their own chunk, ``back`` chunks before it and (not
    ``causal``) ``fwd`` after it; under ``causal`` a key after its query is hidden. Raises where
    :func:`strided_unavailable` names a reason (dropout and key padding are the caller's)."""
    why = strided_unavailable(q)
    if why is not None:
        raise ValueError(f"strided local attention cannot take this call: {why}")
    if window < 1 or back < 0 or fwd < 0:
        raise ValueError(f"window must be >= 1 and back, fwd >= 0, got {window}, {back}, {fwd}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return _forward_op(q, k, v, window, back, fwd, causal, scale)[0]
