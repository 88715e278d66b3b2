"""Funnel-Transformer's relative attention core on the ops floor: the fused kernel behind
:class:`effiformer.attention.funnel_relative.FunnelRelativeAttention` (Dai et al. 2020, the
official ``rel_attn_core``: content, position and token-type terms in one pass).

The queries are processed in chunks of rows; each chunk's scores (content ``(q + u) k^T``, the
position term against the distance table read through :func:`relative_shift`, the token-type and
[CLS] terms as low-rank factors, key padding) go into reused scratch buffers, then softmax,
dropout (its mask regenerated from a seed in the backward) and the value product. The autograd
node keeps only its inputs and recomputes each chunk's probabilities in the backward, so the
memory is O(chunk x Tk) instead of O(Tq x Tk). The mechanism (what the terms are, how positions
and segments are built) stays in the attention part; this file imports torch only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["NEG_INF", "funnel_attention_core", "relative_shift"]

NEG_INF = -1e6
_CHUNK = 256  # at most this many query rows per relative-shift chunk
_MIN_CHUNK = 64  # at least this many (tq // 8 in between: little waste, few Python steps)


def relative_shift(x: Tensor, tk: int, shift: int) -> Tensor:
    """(B, H, Tq, R) scores against the distance table -> (B, H, Tq, Tk) *view* of x.

    Entry (i, j) of the result is ``x[..., i, shift*(Tq - i) + j]``: the (Tq, R) block is read as
    (R, Tq), its first ``shift`` rows dropped (a contiguous slice), read back as
    (Tq, R - shift) and narrowed to Tk columns. Writing into the view writes into x.
    """
    b, h, tq, r = x.shape
    if r < tk + shift * tq:
        raise ValueError(f"distance table of length {r} is shorter than Tk + shift*Tq")
    y = x.view(b, h, r, tq)[:, :, shift:]  # (B, H, R - shift, Tq), a contiguous slice
    y = y.view(b, h, tq, r - shift)  # (B, H, Tq, R - shift)
    return y[..., :tk]


def _chunks(tq: int):
    size = min(_CHUNK, max(_MIN_CHUNK, tq // 8))
    for i0 in range(0, tq, size):
        yield i0, min(i0 + size, tq)


def _flat(t: Tensor) -> Tensor:
    """(B, H, T, X) -> contiguous (B*H, T, X) (a copy only when t is a strided view)."""
    return t.reshape(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])


class _Buffers:
    """Chunk-sized scratch tensors reused by every chunk of one core call.

    A fresh multi-MiB tensor per chunk and step costs page faults (glibc returns large blocks to
    the system on free), a measurable share of a chunk's time on a CPU; one flat buffer per role,
    allocated at the first (largest) chunk, is viewed at each chunk's shape instead.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flat: dict[str, Tensor] = {}

    def get(self, name: str, shape, dtype: torch.dtype = torch.float32) -> Tensor:
        n = math.prod(shape)
        buf = self.flat.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = self.flat[name] = torch.empty(n, dtype=dtype, device=self.device)
        return buf[:n].view(shape)


def _chunk_qv(qu, pb, row0: bool, i0: int, i1: int) -> Tensor:
    """The position query ``(q + v)`` of rows [i0, i1) laid out head-major for the distance
    matmul: ``qu + pb`` with row 0 zeroed when ``row0`` (the cls-mask), (H, B, c, Dh).
    ``qu`` is (B, H, Tq, Dh); recomputed from it, never stored."""
    b, h, _, dh = qu.shape
    qv = qu.new_empty(h, b, i1 - i0, dh)
    torch.add(qu[:, :, i0:i1].transpose(0, 1), pb[:, None, None, :], out=qv)
    if row0 and i0 == 0:
        qv[:, :, 0] = 0
    return qv


def _chunk_scores(quf, kt, qff, kft, c0, kb, qv, r, shift: int, i0: int, i1: int, bufs) -> Tensor:
    """Scores of query rows [i0, i1): qu·k^T + qf·kf^T + the relative-shift term, plus ``c0`` on
    column 0 and the key bias ``kb``, (B, H, c, Tk).

    quf (B*H, Tq, Dh), qff (B*H, Tq, F): contiguous queries and query feature columns;
    kt (B*H, Dh, Tk), kft (B*H, F, Tk): keys and key feature columns, transposed; qv: the
    chunk's position query from :func:`_chunk_qv`; ``bufs``: the call's :class:`_Buffers`.
    """
    bh, tq = quf.shape[:2]
    tk, c = kt.shape[2], i1 - i0
    scores = bufs.get("scores", (bh, c, tk), quf.dtype)
    if qv is None:
        torch.bmm(quf[:, i0:i1], kt, out=scores)
    else:
        h, b = qv.shape[:2]
        lo = shift * (tq - i1)
        width = tk + shift * c
        r_c = r[:, lo : lo + width]  # (H, Tk + shift*c, Dh): the distances rows i0..i1 see
        full = bufs.get("full", (h, b * c, width), quf.dtype)
        torch.bmm(qv.view(h, b * c, -1), r_c.transpose(1, 2), out=full)  # (H, B*c, width)
        full = full.view(h, b, c, width).transpose(0, 1)  # (B, H, c, width)
        scores.view(b, h, c, tk).copy_(relative_shift(full, tk, shift))  # (B*H, c, Tk)
        scores.baddbmm_(quf[:, i0:i1], kt)
    if qff is not None:
        scores.baddbmm_(qff[:, i0:i1], kft)
    if c0 is not None:
        scores[:, :, 0] += c0.reshape(bh, -1)[:, i0:i1]
    if kb is not None:
        scores.view(kb.shape[0], -1, c, tk).add_(kb)
    return scores  # (B*H, c, Tk)


def _keep_mask(gen, shape, p: float, bufs: _Buffers) -> Tensor:
    """A Bernoulli(1 - p) keep mask of ``shape`` (bool), drawn from ``gen``.

    Two mask entries per 64-bit draw: each int64 from ``random_`` (uniform on [0, 2^63)) is read as
    two int32 words, each masked to 31 uniform bits and kept when >= round(p 2^31), so P(keep) is
    1 - p up to 2^-32. On a CPU this is ~2-3x faster than ``bernoulli_``, which spends a draw on
    every entry; the mask is drawn twice per chunk (forward and backward), so it matters.
    """
    n = math.prod(shape)
    words = bufs.get("words", ((n + 1) // 2,), torch.int64).random_(generator=gen)
    u = words.view(torch.int32)[:n].bitwise_and_(0x7FFFFFFF)
    return torch.ge(u, round(p * 2**31), out=bufs.get("keep", (n,), torch.bool)).view(shape)


# The forward and the backward are registered operators (``torch.library.custom_op``) with fake
# implementations and a registered autograd formula, so that ``torch.compile`` and
# ``torch.export`` see one opaque op each (the chunk loop, the scratch buffers and their ``out=``
# writes stay inside it). Absent inputs are ``None``; absent gradients come back from the backward
# op as empty tensors (an op returns tensors only) and are turned into ``None`` here.


@torch.library.custom_op("effiformer::funnel_core_forward", mutates_args=())
def _forward_op(
    qu: Tensor,
    k: Tensor,
    v: Tensor,
    qf: Tensor | None,
    kf: Tensor | None,
    c0: Tensor | None,
    kb: Tensor | None,
    r: Tensor | None,
    pb: Tensor | None,
    row0: bool,
    shift: int,
    p: float,
    seed: int,
) -> Tensor:
    b, h, tq, _ = qu.shape
    quf = _flat(qu)  # (B*H, Tq, Dh), contiguous (transient when qu is a strided view)
    qff = None if qf is None else _flat(qf)
    kt = _flat(k).transpose(1, 2)  # (B*H, Dh, Tk)
    kft = None if kf is None else _flat(kf).transpose(1, 2)  # (B*H, F, Tk)
    vf = _flat(v)  # (B*H, Tk, Dv)
    out = v.new_empty(b, tq, h, v.shape[-1]).permute(0, 2, 1, 3)  # (B, H, Tq, Dv) view
    gen = torch.Generator(device=qu.device).manual_seed(seed) if p > 0 else None
    bufs = _Buffers(qu.device)
    for i0, i1 in _chunks(tq):
        qv = None if r is None else _chunk_qv(qu, pb, row0, i0, i1)
        s = _chunk_scores(quf, kt, qff, kft, c0, kb, qv, r, shift, i0, i1, bufs)  # (B*H, c, Tk)
        probs = torch.ops.aten._softmax.out(s, -1, False, out=bufs.get("probs", s.shape, s.dtype))
        del s
        if gen is not None:
            probs.mul_(_keep_mask(gen, probs.shape, p, bufs)).mul_(1.0 / (1.0 - p))
        out[:, :, i0:i1] = torch.bmm(probs, vf).view(b, h, i1 - i0, -1)
    return out


@_forward_op.register_fake
def _(qu, k, v, qf, kf, c0, kb, r, pb, row0, shift, p, seed):
    b, h, tq, _ = qu.shape
    return v.new_empty(b, tq, h, v.shape[-1]).permute(0, 2, 1, 3)


@torch.library.custom_op("effiformer::funnel_core_backward", mutates_args=())
def _backward_op(
    grad_out: Tensor,
    qu: Tensor,
    k: Tensor,
    v: Tensor,
    qf: Tensor | None,
    kf: Tensor | None,
    c0: Tensor | None,
    kb: Tensor | None,
    r: Tensor | None,
    pb: Tensor | None,
    out: Tensor,
    row0: bool,
    shift: int,
    p: float,
    seed: int,
    need_kf: bool,
) -> list[Tensor]:
    b, h, tq, dh = qu.shape
    tk = k.shape[2]
    bh = b * h
    quf = _flat(qu)  # (B*H, Tq, Dh)
    qff = None if qf is None else _flat(qf)
    kf_ = _flat(k)  # (B*H, Tk, Dh)
    kt = kf_.transpose(1, 2)
    kff = None if kf is None else _flat(kf)
    kft = None if kff is None else kff.transpose(1, 2)
    vf = _flat(v)  # (B*H, Tk, Dv)
    gof = _flat(grad_out)  # (B*H, Tq, Dv)
    delta = (grad_out * out).sum(-1).reshape(bh, tq)  # rowsum(P dP) = rowsum(dO O)
    gen = torch.Generator(device=qu.device).manual_seed(seed) if p > 0 else None
    grad_qu = qu.new_empty(bh, tq, dh)
    grad_k = torch.zeros_like(kf_)
    grad_v = torch.zeros_like(vf)
    grad_qf = None if qf is None else qff.new_empty(qff.shape)
    grad_kf = None if kf is None or not need_kf else torch.zeros_like(kff)
    grad_c0 = None if c0 is None else c0.new_empty(bh, tq)
    grad_r = None if r is None else torch.zeros_like(r)
    grad_pb = None if r is None else torch.zeros_like(pb)
    bufs = _Buffers(qu.device)
    for i0, i1 in _chunks(tq):
        c = i1 - i0
        qv = None if r is None else _chunk_qv(qu, pb, row0, i0, i1)
        s = _chunk_scores(quf, kt, qff, kft, c0, kb, qv, r, shift, i0, i1, bufs)
        probs = bufs.get("probs", s.shape, s.dtype)  # (B*H, c, Tk), recomputed
        torch.ops.aten._softmax.out(s, -1, False, out=probs)
        del s
        g_out = gof[:, i0:i1]  # (B*H, c, Dv)
        grad_p = bufs.get("grad_p", probs.shape, probs.dtype)
        torch.bmm(g_out, vf.transpose(1, 2), out=grad_p)  # (B*H, c, Tk)
        if gen is not None:
            keep = _keep_mask(gen, probs.shape, p, bufs)
            # the scores buffer is free again: dropped-out and rescaled probabilities
            kept = torch.mul(probs, keep, out=bufs.get("scores", probs.shape, probs.dtype))
            grad_v.baddbmm_(kept.mul_(1.0 / (1.0 - p)).transpose(1, 2), g_out)
            grad_p.mul_(keep).mul_(1.0 / (1.0 - p))
            del keep, kept
        else:
            grad_v.baddbmm_(probs.transpose(1, 2), g_out)
        grad_s = grad_p.sub_(delta[:, i0:i1, None]).mul_(probs)  # softmax backward
        del probs
        if grad_c0 is not None:
            grad_c0[:, i0:i1] = grad_s[:, :, 0]
        torch.bmm(grad_s, kf_, out=grad_qu[:, i0:i1])
        grad_k.baddbmm_(grad_s.transpose(1, 2), quf[:, i0:i1])
        if qf is not None:
            torch.bmm(grad_s, kff, out=grad_qf[:, i0:i1])
            if grad_kf is not None:
                grad_kf.baddbmm_(grad_s.transpose(1, 2), qff[:, i0:i1])
        if r is not None:
            lo = shift * (tq - i1)
            width = tk + shift * c
            r_c = r[:, lo : lo + width]  # (H, width, Dh)
            g = bufs.get("g", (h, b, c, width), grad_s.dtype)  # (H, B, c, width)
            # Zero only what the shifted view does not cover, then write the view.
            flat = g.view(h, b, c * width)
            flat[..., : shift * c].zero_()
            flat[..., shift * c :].view(h, b, c, width - shift)[..., tk:].zero_()
            relative_shift(g.transpose(0, 1), tk, shift).copy_(grad_s.view(b, h, c, tk))
            g = g.view(h, b * c, width)
            g_qv = torch.bmm(g, r_c).view(h, b, c, dh)  # (H, B, c, Dh)
            if row0 and i0 == 0:
                g_qv[:, :, 0] = 0
            grad_qu.view(b, h, tq, dh)[:, :, i0:i1] += g_qv.transpose(0, 1)
            grad_pb += g_qv.sum((1, 2))
            grad_r[:, lo : lo + width].baddbmm_(g.transpose(1, 2), qv.view(h, b * c, dh))

    def empty() -> Tensor:  # one per absent gradient: outputs may not alias each other
        return qu.new_empty(0)

    def flat(t: Tensor | None, like: Tensor | None) -> Tensor:
        return empty() if t is None or like is None else t.view(like.shape)

    return [
        flat(grad_qu, qu),
        flat(grad_k, k),
        flat(grad_v, v),
        flat(grad_qf, qf),
        flat(grad_kf, kf),
        flat(grad_c0, c0),
        empty() if grad_r is None else grad_r,
        empty() if grad_pb is None else grad_pb,
    ]


@_backward_op.register_fake
def _(grad_out, qu, k, v, qf, kf, c0, kb, r, pb, out, row0, shift, p, seed, need_kf):
    def like(t: Tensor | None, keep: bool = True) -> Tensor:
        return (
            qu.new_empty(0)
            if t is None or not keep
            else torch.empty_like(t, memory_format=torch.contiguous_format)
        )

    return [like(qu), like(k), like(v), like(qf), like(kf, need_kf), like(c0), like(r), like(pb)]


def _setup_context(ctx, inputs, output) -> None:
    qu, k, v, qf, kf, c0, kb, r, pb, row0, shift, p, seed = inputs
    ctx.save_for_backward(qu, k, v, qf, kf, c0, kb, r, pb, output)
    ctx.row0, ctx.shift, ctx.p, ctx.seed = row0, shift, p, seed


def _backward(ctx, grad_out):
    qu, k, v, qf, kf, c0, kb, r, pb, out = ctx.saved_tensors
    need = getattr(ctx, "needs_input_grad", None)
    need_kf = kf is not None and (need is None or bool(need[4]))
    grads = _backward_op(
        grad_out.contiguous(), qu, k, v, qf, kf, c0, kb, r, pb, out,
        ctx.row0, ctx.shift, ctx.p, ctx.seed, need_kf,
    )  # fmt: skip
    given = (qu, k, v, qf, kf, c0, r, pb)
    gq, gk, gv, gqf, gkf, gc0, gr, gpb = (
        None if t is None or g.numel() == 0 and t.numel() != 0 else g for g, t in zip(grads, given)
    )
    return gq, gk, gv, gqf, gkf, gc0, None, gr, gpb, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def funnel_attention_core(
    qu: Tensor,
    k: Tensor,
    v: Tensor,
    qf: Tensor | None,
    kf: Tensor | None,
    c0: Tensor | None,
    kb: Tensor | None,
    r: Tensor | None,
    pb: Tensor | None,
    row0: bool,
    shift: int,
    p: float,
    seed: int,
) -> Tensor:
    """out = dropout(softmax(qu·k^T + qf·kf^T + shift(qv·r^T))) @ v, in query chunks.

    qu (B, H, Tq, Dh), k (B, H, Tk, Dh): content query (with the u bias) and keys.
    qf (B, H, Tq, F), kf (B, H, Tk, F): the low-rank feature columns (token types, factorized
        positions), or both None.
    c0 (B, H, Tq): added to column 0 (the [CLS] column correction), or None.
    kb (B, 1, 1, Tk): an additive key bias without gradient (padding), or None.
    r (H, Tk + shift*Tq, Dh), pb (H, Dh): the relative-shift term with the position query
        ``qv = qu + pb`` (row 0 zeroed when ``row0``), or both None.
    p: attention dropout; its masks are drawn chunk by chunk from a generator seeded with
    ``seed`` and drawn again in the backward pass.

    Like flash attention, only the inputs and the output are kept (``qv``, the scores and their
    softmax are recomputed chunk by chunk in the backward pass), so no (B, H, Tq, Tk)
    tensor outlives a chunk. Inputs may be strided views (the heads of a projection): they are
    saved as given and made contiguous only transiently. The output is laid out as
    (B, Tq, H, Dv) in memory and returned as a (B, H, Tq, Dv) view, so the caller's
    ``transpose(1, 2).reshape(B, Tq, H*Dv)`` is free.
    """
    return _forward_op(qu, k, v, qf, kf, c0, kb, r, pb, bool(row0), int(shift), float(p), int(seed))
