"""The chunked attention kernel of LSH attention (the Reformer's), on the ops floor: attention
inside chunks of a sorted stream plus each chunk's neighbours (circularly), every round of hashing
combined by its logsumexp, as two registered operators (forward and backward) that keep q, k, v, the output and one
logsumexp per slot and recomputes each block of logits in the backward (flash-attention style).
The mechanism (``effiformer.attention.lsh``) owns the mathematics around it: the hashing, the
sort (whose permutation it hands over as ``positions`` and ``slots``), the shared-QK keys.

    layout = chunked_layout(positions, slots, heads, chunk, causal=..., real=...,
                            n_chunks_before=1, n_chunks_after=0, duplicate_correction=False)
    out = chunked_attention(q, k, v, layout, dropout_p=0.0, impl="auto")   # (B, H, L, Dh)

Masks on original positions are added to the logits as trax does (subtracted, never ``-inf``):
later and padded keys ``-CAUSAL_MASK_VALUE``, the query's own position ``-SELF_MASK_VALUE``;
``duplicate_correction`` lowers a key met ``N`` times over the rounds by ``log N`` (the paper's
correction). ``impl``: ``"auto"`` (the CPU flash kernel of :mod:`.flash_cpu` per block where it
applies -- CPU, no dropout -- else plain matmuls), ``"fused"`` or ``"manual"`` (the same
arithmetic either way). See :mod:`effiformer.attention.lsh` for the derivation of the backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from .flash_cpu import flash_backward, flash_forward, flash_unavailable

__all__ = [
    "CAUSAL_MASK_VALUE",
    "SELF_MASK_VALUE",
    "ChunkedLayout",
    "chunked_attention",
    "chunked_attention_weights",
    "chunked_layout",
]

#: Added (negated) to the logits of keys a query may not see: trax's ``mask_self_attention``.
CAUSAL_MASK_VALUE = 1e9
#: Added (negated) to the logit of the key at the query's own position.
SELF_MASK_VALUE = 1e5

#: Slots (per stream x streams) whose sorted outputs are combined together (a group of streams).
_GROUP_SLOTS = 1 << 16
#: Elements of one block of (chunk queries x window keys) logits.
_BLOCK_ELEMENTS = 1 << 21


def _mask_values(dtype: torch.dtype) -> tuple[float, float]:
    """(masked, self) logit offsets: trax's 1e9 / 1e5; HF's 1e4 / 1e3 in float16 (1e9
    overflows it)."""
    if dtype == torch.float16:
        return 1e4, 1e3
    return CAUSAL_MASK_VALUE, SELF_MASK_VALUE


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(frozen=True)
class ChunkedLayout:
    """Index tensors of one call, shared by the forward, the backward and the weights helper.

    The inputs are flat rows in the projections' own order, row ``(b * L + position) * H + h``
    (no transposing copies). bh: the B*H streams (stream ``b * H + h``), each of ``length``
    positions and ``n_hashes * length`` sorted slots; chunk / n_chunks: chunk length and chunks
    per stream; before / after: window chunks; q_rows (BH, S): flat row of each slot; undo
    (BH, n_h, L): slot (within its stream) of each (round, position); stream_rows (BH, L): flat
    row of each (stream, position); real (B*L,): key validity or ``None``; locs (rows, n_h):
    chunk of each (row, round), for the duplicate count, or ``None``.
    """

    bh: int
    heads: int
    length: int
    n_hashes: int
    chunk: int
    n_chunks: int
    before: int
    after: int
    causal: bool
    q_rows: Tensor
    undo: Tensor
    stream_rows: Tensor
    real: Tensor | None
    locs: Tensor | None

    @property
    def slots(self) -> int:
        return self.n_hashes * self.length

    @property
    def width(self) -> int:
        return self.before + 1 + self.after

    @property
    def window(self) -> int:
        return self.width * self.chunk

    def position(self, rows: Tensor) -> Tensor:
        """Flat rows -> their positions."""
        return (rows // self.heads) % self.length

    def ext_chunks(self) -> Tensor:
        """Chunk ids of the extended stream: the circular neighbours before and after."""
        ids = [n % self.n_chunks for n in range(-self.before, self.n_chunks + self.after)]
        return torch.tensor(ids, device=self.q_rows.device)

    def groups(self) -> Iterator[tuple[int, int]]:
        step = max(1, _GROUP_SLOTS // self.slots)
        for s0 in range(0, self.bh, step):
            yield s0, min(self.bh, s0 + step)

    def blocks(self, g: int) -> Iterator[tuple[int, int]]:
        per_chunk = g * self.chunk * self.window
        if self.locs is not None:
            per_chunk *= max(1, self.n_hashes * self.n_hashes * self.width // 4)
        step = max(1, _BLOCK_ELEMENTS // per_chunk)
        for a in range(0, self.n_chunks, step):
            yield a, min(self.n_chunks, a + step)


@dataclass
class _Group:
    """Streams ``s0 .. s1 - 1``: their slot rows, the extended (circular) key rows, and the
    positions the masks compare."""

    s0: int
    s1: int
    rows: Tensor  # (g, S) flat rows of the slots
    rows_ext: Tensor  # (g, (NC + before + after) * c) flat rows of the extended key stream
    qpos: Tensor  # (g, S) int64 query positions
    kpos_ext: Tensor  # (g, ext) int32 key positions; padded keys far in the future when causal
    kreal_ext: Tensor | None  # (g, ext) key validity (bidirectional models with padding)


def _group(lay: ChunkedLayout, s0: int, s1: int) -> _Group:
    g, nc, c, t = s1 - s0, lay.n_chunks, lay.chunk, lay.length
    rows = lay.q_rows[s0:s1]
    rows_ext = rows.view(g, nc, c)[:, lay.ext_chunks()].reshape(g, -1)
    kpos_ext = lay.position(rows_ext).to(torch.int32)
    kreal_ext = None
    if lay.real is not None:
        kreal_ext = lay.real[rows_ext // lay.heads]
        if lay.causal:  # a padded key is masked like a later one
            kpos_ext = torch.where(kreal_ext, kpos_ext, torch.full_like(kpos_ext, 2 * t + 1))
            kreal_ext = None
    return _Group(s0, s1, rows, rows_ext, lay.position(rows), kpos_ext, kreal_ext)


def _win(t_ext: Tensor, n: int, chunk: int, window: int) -> Tensor:
    """The windows of n chunks as a strided view: t_ext (g, (n + before + after) * c, ...) ->
    (g, n, W, ...) (chunk j's window is rows ``j*c .. j*c + W - 1``)."""
    st = t_ext.stride()
    return t_ext.as_strided(
        (t_ext.shape[0], n, window, *t_ext.shape[2:]),
        (st[0], chunk * st[1], st[1], *st[2:]),
        t_ext.storage_offset(),
    )


def _chunks(t: Tensor, lay: ChunkedLayout, a: int, b: int) -> Tensor:
    """(g, S, ...) -> chunks a .. b-1: (g, b-a, c, ...) view."""
    return t.view(t.shape[0], lay.n_chunks, lay.chunk, *t.shape[2:])[:, a:b]


def _ext(t: Tensor, lay: ChunkedLayout, a: int, b: int) -> Tensor:
    """(g, ext, ...) -> the extended rows chunks a .. b-1 need: (g, (b-a+before+after)*c, ...)."""
    return t[:, a * lay.chunk : (b + lay.before + lay.after) * lay.chunk]


def _bias(lay: ChunkedLayout, gr: _Group, a: int, b: int, dtype: torch.dtype) -> Tensor:
    """Additive mask (g, b-a, c, W) of chunks a .. b-1: -1e9 for later and padded keys, -1e5
    for the query's own position, minus log N_ij with the duplicate correction."""
    masked, own = _mask_values(dtype)
    n = b - a
    qp = _chunks(gr.qpos, lay, a, b).to(torch.int32)[..., None]  # (g, n, c, 1)
    kp = _win(_ext(gr.kpos_ext, lay, a, b), n, lay.chunk, lay.window)[:, :, None, :]  # (g,n,1,W)
    d = kp - qp  # (g, n, c, W)
    bias = torch.zeros(d.shape, dtype=dtype, device=d.device)
    bias.masked_fill_(d == 0, -own)
    if lay.causal:
        bias.masked_fill_(d > 0, -masked)
    if gr.kreal_ext is not None:
        kr = _win(_ext(gr.kreal_ext, lay, a, b), n, lay.chunk, lay.window)[:, :, None, :]
        bias.masked_fill_(~kr, -masked)
    if lay.locs is not None:
        # N_ij: how often key j lies in the windows of query i's copies, over all rounds.
        lq = lay.locs[_chunks(gr.rows, lay, a, b)]  # (g, n, c, n_h)
        lk = lay.locs[_win(_ext(gr.rows_ext, lay, a, b), n, lay.chunk, lay.window)]  # (g,n,W,nh)
        count = torch.zeros(d.shape, dtype=torch.int32, device=d.device)
        for o in range(-lay.before, lay.after + 1):
            seen = (lq + o) % lay.n_chunks  # (g, n, c, n_h): chunks query i sees at offset o
            hit = seen[:, :, :, None, :, None] == lk[:, :, None, :, None, :]  # (g,n,c,W,nh,nh)
            count += hit.sum((-1, -2), dtype=torch.int32)
        bias -= torch.log(count.clamp_min(1).to(dtype))
    return bias


def _keep_mask(shape, gen: torch.Generator, p: float, device, dtype) -> Tensor:
    """Dropout multiplier (0 or 1/(1-p)) of ``shape`` drawn from ``gen``."""
    keep = torch.rand(shape, generator=gen, device=device) >= p
    return keep.to(dtype) / (1.0 - p)


def _dropout_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _use_fused(q: Tensor, dropout_p: float, impl: str) -> bool:
    if impl == "manual":
        return False
    ok = flash_unavailable(q, dropout_p=dropout_p) is None
    if impl == "fused" and not ok:
        raise ValueError(
            "impl='fused' needs the CPU flash-attention kernel, a CPU tensor and no dropout"
        )
    return ok


def _block_inputs(lay, gr, a, b, q, k, v):
    """Queries (g, n, c, Dh) and window keys / values (g, n, W, Dh, strided views over the
    block's extended rows) of chunks a .. b-1, and the rows they came from."""
    g, n, dh = gr.s1 - gr.s0, b - a, q.shape[-1]
    qr = _chunks(gr.rows, lay, a, b)  # (g, n, c)
    er = _ext(gr.rows_ext, lay, a, b)  # (g, (n + E) c)
    qb = q[qr.reshape(-1)].view(g, n, lay.chunk, dh)
    ke, ve = k[er.reshape(-1)].view(g, -1, dh), v[er.reshape(-1)].view(g, -1, dh)
    kw, vw = _win(ke, n, lay.chunk, lay.window), _win(ve, n, lay.chunk, lay.window)
    return qr, er, qb, kw, vw


# The forward and the backward are registered operators (``torch.library.custom_op``) with fake
# implementations and a registered autograd formula, so that ``torch.compile`` and
# ``torch.export`` see one opaque op each (the group and block loops, the strided window views
# and the in-place writes stay inside). The layout travels as its tensors and integers
# (:func:`_layout_args`); the forward also returns the per-slot logsumexp and the per-position
# round normalisers the backward reads (not differentiable).


def _layout_args(lay: ChunkedLayout) -> tuple:
    return (lay.q_rows, lay.undo, lay.stream_rows, lay.real, lay.locs, lay.heads, lay.length,
            lay.n_hashes, lay.chunk, lay.before, lay.after, lay.causal)  # fmt: skip


def _layout(q_rows, undo, stream_rows, real, locs, heads, length, n_hashes, chunk, before, after,
            causal) -> ChunkedLayout:  # fmt: skip
    return ChunkedLayout(
        bh=q_rows.shape[0], heads=heads, length=length, n_hashes=n_hashes, chunk=chunk,
        n_chunks=n_hashes * length // chunk, before=before, after=after, causal=causal,
        q_rows=q_rows, undo=undo, stream_rows=stream_rows, real=real, locs=locs,
    )  # fmt: skip


@torch.library.custom_op("effiformer::lsh_chunked_forward", mutates_args=())
def _forward_op(
    q: Tensor, k: Tensor, v: Tensor,
    q_rows: Tensor, undo: Tensor, stream_rows: Tensor, real: Tensor | None, locs: Tensor | None,
    heads: int, length: int, n_hashes: int, chunk: int, before: int, after: int, causal: bool,
    dropout_p: float, seed: int, has_seed: bool, fused: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(o (rows, Dh), lse_sorted (BH, S), norm (BH, 2, L)); see :func:`chunked_attention`."""
    lay = _layout(q_rows, undo, stream_rows, real, locs, heads, length, n_hashes, chunk, before,
                  after, causal)  # fmt: skip
    acc = _acc_dtype(q.dtype)
    dh = q.shape[-1]
    o = q.new_empty(q.shape)
    lse_sorted = torch.empty(lay.bh, lay.slots, dtype=acc, device=q.device)
    norm = torch.empty(lay.bh, 2, lay.length, dtype=acc, device=q.device)
    gen = _dropout_generator(seed if has_seed else None, q.device)
    with torch.autocast(q.device.type, enabled=False):
        for s0, s1 in lay.groups():
            gr = _group(lay, s0, s1)
            o_s = torch.empty(s1 - s0, lay.slots, dh, dtype=q.dtype, device=q.device)
            lse_s = lse_sorted[s0:s1]  # (g, S)
            for a, b in lay.blocks(s1 - s0):
                _, _, qb, kw, vw = _block_inputs(lay, gr, a, b, q, k, v)
                bias = _bias(lay, gr, a, b, q.dtype if fused else acc)
                if fused:
                    out, lse = flash_forward(qb, kw, vw, 0.0, False, attn_mask=bias, scale=1.0)
                else:
                    s = torch.matmul(qb, kw.transpose(-1, -2)).to(acc) + bias  # (g,n,c,W)
                    lse = torch.logsumexp(s, dim=-1)
                    # normalised by the sum, not exp(s - lse): exact when every visible
                    # logit is near -1e5 (a token alone with itself, maybe twice)
                    p = torch.softmax(s, dim=-1)
                    if gen is not None:
                        p = p * _keep_mask(p.shape, gen, dropout_p, q.device, acc)
                    out = torch.matmul(p.to(v.dtype), vw)
                _chunks(o_s, lay, a, b).copy_(out)
                _chunks(lse_s, lay, a, b).copy_(lse)
            o_g, norm[s0:s1] = _combine(lay, s0, s1, o_s, lse_s)
            o.index_copy_(0, lay.stream_rows[s0:s1].reshape(-1), o_g)
    return o, lse_sorted, norm


@_forward_op.register_fake
def _(q, k, v, q_rows, undo, stream_rows, real, locs, heads, length, n_hashes, chunk, before,
      after, causal, dropout_p, seed, has_seed, fused):  # fmt: skip
    acc = _acc_dtype(q.dtype)
    bh = q_rows.shape[0]
    return (
        q.new_empty(q.shape),
        q.new_empty(bh, n_hashes * length, dtype=acc),
        q.new_empty(bh, 2, length, dtype=acc),
    )


@torch.library.custom_op("effiformer::lsh_chunked_backward", mutates_args=())
def _backward_op(
    grad_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse_sorted: Tensor, norm: Tensor,
    q_rows: Tensor, undo: Tensor, stream_rows: Tensor, real: Tensor | None, locs: Tensor | None,
    heads: int, length: int, n_hashes: int, chunk: int, before: int, after: int, causal: bool,
    dropout_p: float, seed: int, has_seed: bool, fused: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv), each (rows, Dh): every block of logits recomputed."""
    lay = _layout(q_rows, undo, stream_rows, real, locs, heads, length, n_hashes, chunk, before,
                  after, causal)  # fmt: skip
    acc = _acc_dtype(q.dtype)
    dh = q.shape[-1]
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    grad_o = grad_o.contiguous()
    gen = _dropout_generator(seed if has_seed else None, q.device)
    with torch.autocast(q.device.type, enabled=False):
        for s0, s1 in lay.groups():
            gr = _group(lay, s0, s1)
            g = s1 - s0
            lse_s = lse_sorted[s0:s1]  # (g, S)
            w = _round_weights(norm[s0:s1], lse_s, gr.qpos)  # (g, S) round weights
            # gradients per sorted slot (no scatter-add: CPU index_add_ is erratic), unsorted
            # through the inverse permutation at the end
            dq_s, dk_s, dv_s = torch.zeros(3, g, lay.slots, dh, dtype=q.dtype, device=q.device)
            for a, b in lay.blocks(g):
                qr, _, qb, kw, vw = _block_inputs(lay, gr, a, b, q, k, v)
                flat = qr.reshape(-1)
                wb = _chunks(w, lay, a, b)[..., None]  # (g, n, c, 1)
                gb = (grad_o[flat].view(qb.shape).to(acc) * wb).to(q.dtype)  # w_r dO
                ob = o[flat].view(qb.shape)  # the combined output at each slot
                lse = _chunks(lse_s, lay, a, b)
                bias = _bias(lay, gr, a, b, q.dtype if fused else acc)
                if fused:
                    gq, gk, gv = flash_backward(
                        gb, qb, kw, vw, ob, lse, 0.0, False, attn_mask=bias, scale=1.0
                    )
                else:
                    s = torch.matmul(qb, kw.transpose(-1, -2)).to(acc) + bias
                    p = torch.softmax(s, dim=-1)  # (g, n, c, W), as in the forward
                    dp = torch.matmul(gb, vw.transpose(-1, -2)).to(acc)
                    if gen is not None:
                        m = _keep_mask(p.shape, gen, dropout_p, q.device, acc)
                        pd, dp = p * m, dp * m
                    else:
                        pd = p
                    delta = (gb.to(acc) * ob.to(acc)).sum(-1, keepdim=True)  # (g,n,c,1)
                    ds = (p * (dp - delta)).to(q.dtype)
                    gq = torch.matmul(ds, kw)  # (g, n, c, Dh)
                    gk = torch.matmul(ds.transpose(-1, -2), qb)  # (g, n, W, Dh)
                    gv = torch.matmul(pd.to(v.dtype).transpose(-1, -2), gb)
                _chunks(dq_s, lay, a, b).copy_(gq)
                # window part i of chunk j belongs to chunk j + i - before (circularly)
                for i in range(lay.width):
                    part = slice(i * lay.chunk, (i + 1) * lay.chunk)
                    _add_chunks(dk_s, lay, a + i - lay.before, gk[:, :, part])
                    _add_chunks(dv_s, lay, a + i - lay.before, gv[:, :, part])
            rows = lay.stream_rows[s0:s1].reshape(-1)
            dq[rows] = _unsort(lay, s0, s1, dq_s)
            dk[rows] = _unsort(lay, s0, s1, dk_s)
            dv[rows] = _unsort(lay, s0, s1, dv_s)
    return dq, dk, dv


@_backward_op.register_fake
def _(grad_o, q, k, v, o, lse_sorted, norm, q_rows, undo, stream_rows, real, locs, heads, length,
      n_hashes, chunk, before, after, causal, dropout_p, seed, has_seed, fused):  # fmt: skip
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, *layout_tensors = inputs[:8]
    o, lse_sorted, norm = output
    ctx.save_for_backward(q, k, v, o, lse_sorted, norm, *layout_tensors)
    ctx.rest = inputs[8:]  # the layout's integers, dropout_p, seed, has_seed, fused
    ctx.mark_non_differentiable(lse_sorted, norm)


def _backward(ctx, grad_o, grad_lse, grad_norm):
    q, k, v, o, lse_sorted, norm, *layout_tensors = ctx.saved_tensors
    dq, dk, dv = _backward_op(grad_o.contiguous(), q, k, v, o, lse_sorted, norm,
                              *layout_tensors, *ctx.rest)  # fmt: skip
    return (dq, dk, dv) + (None,) * 16


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def _add_chunks(t_s: Tensor, lay: ChunkedLayout, first: int, part: Tensor) -> None:
    """Add part (g, n, c, Dh) to the chunks ``first .. first + n - 1`` (mod the chunk count) of
    the slot tensor t_s (g, S, Dh), as contiguous slices."""
    n, nc = part.shape[1], lay.n_chunks
    t4 = t_s.view(t_s.shape[0], nc, lay.chunk, t_s.shape[-1])
    done = 0
    while done < n:
        start = (first + done) % nc
        m = min(n - done, nc - start)
        t4[:, start : start + m] += part[:, done : done + m]
        done += m


def _unsort(lay: ChunkedLayout, s0: int, s1: int, t_s: Tensor) -> Tensor:
    """Slot values (g, S, Dh) summed over each position's rounds -> (g * L, Dh) in stream order
    (gathers through the inverse permutation, one round at a time)."""
    g, _, dh = t_s.shape
    out = None
    for r in range(lay.n_hashes):
        part = t_s.gather(1, lay.undo[s0:s1, r, :, None].expand(g, lay.length, dh))
        out = part if out is None else out + part
    return out.reshape(-1, dh)


def _combine(
    lay: ChunkedLayout, s0: int, s1: int, o_s: Tensor, lse_s: Tensor
) -> tuple[Tensor, Tensor]:
    """Unsort the rounds and weight them by their logsumexp: o_s (g, S, Dh), lse_s (g, S) ->
    o (g * L, Dh) in stream order and ``norm`` (g, 2, L): the max over rounds and the sum of
    ``exp(lse_r - max)``, so that a slot's round weight is ``exp(lse - max) / sum`` (a softmax
    over rounds: the weights sum to 1 to rounding even when every round's logsumexp is near
    -1e5, a token alone with itself). Gathers through the inverse permutation, one round at a
    time (no scatter)."""
    g, _, dh = o_s.shape
    undo = lay.undo[s0:s1]  # (g, n_h, L)
    lse_r = lse_s.gather(1, undo.reshape(g, -1)).view(g, lay.n_hashes, lay.length)
    top = lse_r.amax(dim=1)  # (g, L)
    e = torch.exp(lse_r - top[:, None])  # (g, n_h, L)
    z = e.sum(1)  # (g, L)
    w = (e / z[:, None]).to(
        torch.float32 if o_s.dtype in (torch.float16, torch.bfloat16) else o_s.dtype
    )
    o = None
    for r in range(lay.n_hashes):
        o_r = o_s.gather(1, undo[:, r, :, None].expand(g, lay.length, dh))  # (g, L, Dh)
        term = o_r.to(w.dtype) * w[:, r, :, None]
        o = term if o is None else o + term
    return o.reshape(-1, dh).to(o_s.dtype), torch.stack([top, z], dim=1)


def _round_weights(norm: Tensor, lse_s: Tensor, qpos: Tensor) -> Tensor:
    """Round weight of each slot (g, S) from its logsumexp lse_s (g, S), the position's
    ``norm`` (g, 2, L) and the slot positions qpos (g, S)."""
    top, z = norm[:, 0].gather(1, qpos), norm[:, 1].gather(1, qpos)
    return torch.exp(lse_s - top) / z


def chunked_layout(
    positions: Tensor,
    slots: Tensor,
    chunk: int,
    *,
    causal: bool,
    real: Tensor | None = None,
    n_chunks_before: int = 1,
    n_chunks_after: int = 0,
    duplicate_correction: bool = False,
) -> ChunkedLayout:
    """The index tensors of one call from the sort: ``positions`` (B, H, n_hashes * L), the
    original position at each slot of the sorted stream (round r fills slots r*L .. r*L + L - 1),
    and ``slots`` (B, H, n_hashes, L), the slot of each (round, position); ``real``: (B, L) bool,
    False = padding (give padding a bucket of its own so it never moves real tokens); ``L`` a
    multiple of ``chunk``."""
    b, h, n, t = slots.shape
    if t % chunk:
        raise ValueError(f"LSH attention needs L a multiple of chunk, got L={t}, chunk={chunk}")
    bh = b * h
    dev = slots.device
    # flat row of (b, h, position) in the (B, L, H) order: (b * L + position) * H + h
    base = (torch.arange(b, device=dev)[:, None] * t * h + torch.arange(h, device=dev)).reshape(
        bh, 1
    )
    q_rows = positions.reshape(bh, n * t) * h + base  # (BH, S)
    stream_rows = torch.arange(t, device=dev) * h + base  # (BH, L)
    undo = slots.reshape(bh, n, t).contiguous()  # slot r * L + j of (round r, position)
    locs = None
    if duplicate_correction:
        chunk_of = (undo // chunk).transpose(1, 2).reshape(-1, n)  # (BH*L, n) in stream order
        locs = torch.empty(b * t * h, n, dtype=chunk_of.dtype, device=dev)
        locs[stream_rows.reshape(-1)] = chunk_of
    return ChunkedLayout(
        bh=bh,
        heads=h,
        length=t,
        n_hashes=n,
        chunk=chunk,
        n_chunks=n * t // chunk,
        before=n_chunks_before,
        after=n_chunks_after,
        causal=causal,
        q_rows=q_rows.contiguous(),
        undo=undo,
        stream_rows=stream_rows.contiguous(),
        real=None if real is None else real.reshape(-1).to(torch.bool),
        locs=locs,
    )


def _rows(t: Tensor) -> Tensor:
    """(B, H, L, Dh) -> flat (B*L*H, Dh) rows in (B, L, H) order; a view when ``t`` is a
    head-transposed view of a (B, L, H, Dh) tensor (the projections' output)."""
    return t.transpose(1, 2).reshape(-1, t.shape[-1])


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: ChunkedLayout,
    *,
    dropout_p: float = 0.0,
    impl: str = "auto",
) -> Tensor:
    """Chunked attention of queries q, keys k, values v (B, H, L, Dh) over ``layout`` ->
    (B, H, L, Dh) (a head-transposed view of (B, L, H, Dh))."""
    if impl not in ("auto", "fused", "manual"):
        raise ValueError(f"impl must be 'auto', 'fused' or 'manual', got {impl!r}")
    b, h, t, dh = q.shape
    seed = None
    if dropout_p > 0.0:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    fused = _use_fused(q, dropout_p, impl)
    o, _, _ = _forward_op(
        _rows(q), _rows(k), _rows(v), *_layout_args(layout), float(dropout_p),
        0 if seed is None else seed, seed is not None, fused,
    )  # fmt: skip
    return o.view(b, t, h, dh).transpose(1, 2)


@torch.no_grad()
def chunked_attention_weights(q: Tensor, k: Tensor, layout: ChunkedLayout) -> Tensor:
    """The (B, H, L, L) attention weights :func:`chunked_attention` applies (rounds combined, a
    key met several times summed), computed by the same blocks and masks. O(L^2): for tests and
    inspection only; the forward never builds it."""
    b, h, t, dh = q.shape
    lay = layout
    qf, kf = _rows(q), _rows(k)
    dense = torch.zeros(lay.bh, t, t, dtype=q.dtype, device=q.device)
    for s0, s1 in lay.groups():
        gr = _group(lay, s0, s1)
        g = s1 - s0
        lse_s = torch.empty(g, lay.slots, dtype=q.dtype, device=q.device)
        probs = []
        for a, b_ in lay.blocks(g):
            qr, er, qb, kw, _ = _block_inputs(lay, gr, a, b_, qf, kf, kf)
            s = torch.matmul(qb, kw.transpose(-1, -2)) + _bias(lay, gr, a, b_, q.dtype)
            _chunks(lse_s, lay, a, b_).copy_(torch.logsumexp(s, -1))
            kpos = lay.position(_win(er, b_ - a, lay.chunk, lay.window))  # (g, n, W)
            probs.append((a, b_, torch.softmax(s, -1), kpos))
        dummy = torch.zeros(g, lay.slots, 1, dtype=q.dtype, device=q.device)
        _, norm = _combine(lay, s0, s1, dummy, lse_s)
        w = _round_weights(norm, lse_s, gr.qpos)  # (g, S)
        for a, b_, p, kpos in probs:
            qp = _chunks(gr.qpos, lay, a, b_)  # (g, n, c)
            pw = p * _chunks(w, lay, a, b_)[..., None]  # (g, n, c, W)
            stream = torch.arange(s0, s1, device=q.device)[:, None, None, None].expand_as(pw)
            idx = (stream, qp[..., None].expand_as(pw), kpos[:, :, None, :].expand_as(pw))
            dense.index_put_(idx, pw, accumulate=True)
    return dense.view(b, h, t, t)
