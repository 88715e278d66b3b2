"""The tiled kernel of the Sparse Transformer's factorized attention, on the ops floor: a plan
of dense tile calls (:class:`TileCall`, prepared with their masks: :class:`PreparedCall`,
gathered in a :class:`SparsePlan`) runs call by call through a fused flash-attention kernel that
also returns each row's log-sum-exp (:mod:`.flash_cpu` on CPU, plain matmuls elsewhere); the
calls' outputs are merged exactly (a softmax over the union of their keys), and the backward hands
each call's kernel the merged output and log-sum-exp and sums their gradients. Only q, k, v, the
output and the log-sum-exp are kept for the backward, so memory grows linearly in the length (and
the work as O(n sqrt(n)) with tiles of l ~ sqrt(n)). The calls read their rows as views of the
natural (B, T, H, Dh) tensors wherever the strides allow, and their outputs and gradients are
merged back onto such views in place. What the calls are -- the strided and fixed
patterns, their head roles and summaries -- is the mechanism's
(:func:`effiformer.attention.sparse.build_plan`); this module runs any plan of these call kinds.

    out = tiled_attention(q, k, v, plan)      # (B, T, H, Dh) each, differentiable
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .flash_cpu import flash_backward, flash_forward, flash_unavailable

__all__ = ["PreparedCall", "SparsePlan", "TileCall", "summary_index", "tiled_attention"]


# ------------------------------------------------------------------------------ tile kernels


def _use_cpu_flash(q: Tensor) -> bool:
    return flash_unavailable(q) is None


def _kernel_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """(B', H', Tq, Dh) x (B', H', Tk, Dh) -> out (B', H', Tq, Dh), lse (B', H', Tq).
    ``causal``: top-left aligned (key kj <= query qi); ``mask``: additive, broadcastable."""
    if _use_cpu_flash(q):
        return flash_forward(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    s = _math_scores(q, k, causal, mask, scale)  # (B', H', Tq, Tk)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])
    return p @ v, lse


def _kernel_backward(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    causal: bool,
    mask: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of one call given the *merged* output ``o`` and log-sum-exp ``lse`` (finite)."""
    if _use_cpu_flash(q):
        return flash_backward(do, q, k, v, o, lse, 0.0, causal, attn_mask=mask, scale=scale)
    s = _math_scores(q, k, causal, mask, scale)
    p = torch.exp(s - lse[..., None])  # (B', H', Tq, Tk)
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    return (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, dv


def _math_scores(q: Tensor, k: Tensor, causal: bool, mask: Tensor | None, scale: float) -> Tensor:
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    if causal:
        tq, tk = s.shape[-2:]
        tri = torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~tri, float("-inf"))
    return s


# ------------------------------------------------------------------------------ the plan

# Kinds of tile call (queries x keys, each batched over the dimension named):
#   "tile"    natural tiles q = [a, z) of length l  x  natural tiles k = [a', z')       (tiles)
#   "col"     rows q of every column of the (n/l, l) grid  x  rows k of that column  (columns)
#   "sum"     natural positions q = [a, z)  x  gathered summary keys k = [a', z')     (-)
#   "usum"    rows q of u-sequence ``sub`` (the queries at in-tile offsets sub c .. sub c + c - 1,
#             in order: query ``r l + sub c + v`` at row ``r c + v``)  x  summary keys k  (-)
#   "sumtile" natural tiles q  x  the c summary keys of summary tiles k               (tiles)


@dataclass(frozen=True)
class TileCall:
    """One dense tile call (kinds above). ``heads``: [h0, h1); ``q``/``k``: row ranges in the
    call's spaces; ``causal``: top-left causal inside the call (key kj <= query qi); ``rel``: a
    structural mask (see ``_structural_keep``)."""

    kind: str
    heads: tuple[int, int]
    q: tuple[int, int]
    k: tuple[int, int]
    causal: bool = False
    rel: str | None = None
    sub: int = 0


@dataclass(frozen=True)
class PreparedCall:
    call: TileCall
    mask: Tensor | None  # additive, broadcastable to the call's (B', H', Tq, Tk)
    empty: Tensor | None  # bool, broadcastable to (B', H', Tq): rows without any key


@dataclass(frozen=True)
class SparsePlan:
    """What :meth:`SparseAttention.prepare` returns: the layout of one forward.

    seq_len: T; padded_len: T rounded up to a multiple of ``stride``; causal; calls: the tile
    calls; bases: (H,) first in-block offset of each head's summary sub-block (fixed pattern);
    key_padding: (B | 1, padded_len) bool or None; dense_keep: the (B | 1, H, T, T) keep-mask
    (``impl="dense"`` only); block_mask: the pattern as a FlexAttention block mask over the T
    real positions (the flex backend: ``impl="flex"``, or ``"tiled"`` on CUDA)."""

    seq_len: int
    padded_len: int
    stride: int
    summary: int
    n_heads: int
    causal: bool
    calls: tuple[PreparedCall, ...] = ()
    bases: tuple[int, ...] = ()
    key_padding: Tensor | None = None
    dense_keep: Tensor | None = None
    block_mask: Any = None  # a FlexAttention BlockMask of the pattern (the flex backend)

    @property
    def n_tiles(self) -> int:
        return self.padded_len // self.stride

    def uses(self, *kinds: str) -> bool:
        return any(pc.call.kind in kinds for pc in self.calls)


def summary_index(bases: tuple[int, ...], c: int, device: torch.device) -> Tensor:
    """(1, 1, c, H, 1) in-block offsets of each head's summary positions."""
    base = torch.tensor(bases, device=device)
    return (base[None, :] + torch.arange(c, device=device)[:, None])[None, None, :, :, None]


# ------------------------------------------------------------------------------ the engine


class _Layouts:
    """How a call's rows sit in the natural (B, Tp, H, ...) tensors (q, k, v, the output, the
    log-sum-exp, the gradients) and in the gathered summaries (B, nt c, H, ...).

    ``q_view`` / ``k_view`` give the call's rows as a *view* (no copy) shaped
    (B, *rows, H', ...): tiles (B, n, l, ...), columns of the (nt, l) grid (B, l, n, ...), plain
    rows (B, n, ...), the rows of one u-sequence (B, n, c, ...) (``n`` counting tiles), summary
    tiles (B, n, c, ...). The kernel reads them as (B', H', T, ...) (``to_kernel``: a view where
    the strides allow, else a copy of the call's rows) and its results come back onto the same
    views (``from_kernel``): outputs are merged and gradients added in place, so no layout but
    the (n c / l)-long summaries is ever materialised whole."""

    def __init__(self, plan: SparsePlan, q: Tensor) -> None:
        self.b, self.tp, self.h, self.dh = q.shape
        self.st, self.c, self.nt = plan.stride, plan.summary, plan.n_tiles
        self.u = self.st // self.c
        self.bases = plan.bases
        self._idx: Tensor | None = None

    # ---- the summaries --------------------------------------------------------------------

    def index(self, device: torch.device) -> Tensor:
        if self._idx is None:
            idx = summary_index(self.bases, self.c, device)
            self._idx = idx.expand(self.b, self.nt, self.c, self.h, self.dh)
        return self._idx

    def to_sum(self, x: Tensor) -> Tensor:
        """Gather each head's summary positions: (B, Tp, H, Dh) -> (B, nt c, H, Dh)."""
        x = x.view(self.b, self.nt, self.st, self.h, self.dh)
        return torch.gather(x, 2, self.index(x.device)).view(self.b, -1, self.h, self.dh)

    def add_from_sum(self, acc: Tensor, g: Tensor) -> None:
        """acc (B, Tp, H, Dh) += the summary gradient g (B, nt c, H, Dh) at its positions."""
        view = acc.view(self.b, self.nt, self.st, self.h, self.dh)
        view.scatter_add_(2, self.index(g.device), g.view(self.b, self.nt, self.c, self.h, -1))

    # ---- rows ------------------------------------------------------------------------------

    def q_view(self, call: TileCall, x: Tensor) -> Tensor:
        """The call's query rows of natural x (B, Tp, H, ...)."""
        (a, z), (h0, h1), rest = call.q, call.heads, x.shape[3:]
        kind = call.kind
        if kind in ("tile", "sumtile"):
            return x.view(self.b, self.nt, self.st, self.h, *rest)[:, a:z, :, h0:h1]
        if kind == "col":
            grid = x.view(self.b, self.nt, self.st, self.h, *rest).transpose(1, 2)
            return grid[:, :, a:z, h0:h1]
        if kind == "usum":  # rows [a, z) of u-sequence ``sub``: whole tiles (a, z multiples of c)
            grid = x.view(self.b, self.nt, self.u, self.c, self.h, *rest)
            return grid[:, a // self.c : z // self.c, call.sub, :, h0:h1]
        return x[:, a:z, h0:h1]

    def k_view(self, call: TileCall, x: Tensor) -> Tensor:
        """The call's key rows of x: natural (tile, col) or summary (sum, usum, sumtile)."""
        (a, z), (h0, h1), rest = call.k, call.heads, x.shape[3:]
        if call.kind == "tile":
            return x.view(self.b, self.nt, self.st, self.h, *rest)[:, a:z, :, h0:h1]
        if call.kind == "col":
            grid = x.view(self.b, self.nt, self.st, self.h, *rest).transpose(1, 2)
            return grid[:, :, a:z, h0:h1]
        if call.kind == "sumtile":
            return x.view(self.b, self.nt, self.c, self.h, *rest)[:, a:z, :, h0:h1]
        return x[:, a:z, h0:h1]

    @staticmethod
    def dims(call: TileCall, side: str) -> tuple[int, int]:
        """(batch, rows) of a rows view: how many leading dims (B included) form the kernel's
        batch B', and how many after them form its sequence T."""
        if call.kind == "sum":
            return 1, 1
        if call.kind == "usum":
            return (1, 2) if side == "q" else (1, 1)
        return 2, 1

    @staticmethod
    def to_kernel(view: Tensor, dims: tuple[int, int]) -> Tensor:
        """A rows view (B, *rows, H', ...) as the kernel's (B', H', T, ...)."""
        nb, nr = dims
        bp, t = math.prod(view.shape[:nb]), math.prod(view.shape[nb : nb + nr])
        return view.reshape(bp, t, *view.shape[nb + nr :]).transpose(1, 2)

    @staticmethod
    def from_kernel(t: Tensor, view: Tensor) -> Tensor:
        """The kernel's (B', H', T, ...) result shaped like the rows view it belongs to."""
        return t.transpose(1, 2).reshape(view.shape)


def _fit(t: Tensor | None, batch: int, dtype: torch.dtype | None = None) -> Tensor | None:
    """A prepared mask made for one sequence (tail padding only: its leading dim counts the
    tiles or columns of one sequence) repeated for a batch of ``batch`` calls."""
    if t is None:
        return None
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if t.shape[0] in (1, batch):
        return t
    return t.repeat(batch // t.shape[0], *([1] * (t.dim() - 1)))


def _operands(
    lay: _Layouts,
    call: TileCall,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ks: Tensor | None,
    vs: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The call's (B', H', T, Dh) query, key and value operands."""
    qk = lay.to_kernel(lay.q_view(call, q), lay.dims(call, "q"))
    if call.kind not in ("tile", "col"):
        assert ks is not None and vs is not None
        k, v = ks, vs
    d = lay.dims(call, "k")
    return qk, lay.to_kernel(lay.k_view(call, k), d), lay.to_kernel(lay.k_view(call, v), d)


def _covers_all(call: TileCall, side: str, lay: _Layouts) -> bool:
    """Whether a tile call's rows on ``side`` are every row and head of the natural tensors
    (then the kernel's result, laid out (B, Tp, H, ...) already, *is* the accumulator)."""
    return call.kind == "tile" and getattr(call, side) == (0, lay.nt) and call.heads == (0, lay.h)


def _run_forward(plan: SparsePlan, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Merged output (B, Tp, H, Dh) and log-sum-exp (B, Tp, H) of every call: each call's
    result is folded into the accumulators' rows in place (online softmax merge)."""
    lay = _Layouts(plan, q)
    scale = q.shape[-1] ** -0.5
    sums = plan.uses("sum", "usum", "sumtile")
    ks, vs = (lay.to_sum(k), lay.to_sum(v)) if sums else (None, None)
    out: Tensor | None = None
    lse: Tensor | None = None
    for pc in plan.calls:
        call = pc.call
        qc, kc, vc = _operands(lay, call, q, k, v, ks, vs)
        o, m = _kernel_forward(qc, kc, vc, call.causal, _fit(pc.mask, qc.shape[0], q.dtype), scale)
        if pc.empty is not None:
            m = m.masked_fill(_fit(pc.empty, qc.shape[0]), float("-inf"))
        if out is None and _covers_all(call, "q", lay):  # the first call fills everything
            out = o.transpose(1, 2).reshape(q.shape)
            lse = m.transpose(1, 2).reshape(q.shape[:3])
            continue
        if out is None or lse is None:
            out = torch.zeros_like(q)
            lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
        acc_o, acc_m = lay.q_view(call, out), lay.q_view(call, lse)
        o, m = lay.from_kernel(o, acc_o), lay.from_kernel(m, acc_m)
        new = torch.logaddexp(acc_m, m)
        ref = new.masked_fill(torch.isneginf(new), 0.0)
        acc_o.mul_(torch.exp(acc_m - ref)[..., None]).add_(o.mul_(torch.exp(m - ref)[..., None]))
        acc_m.copy_(new)
    if out is None or lse is None:  # no call at all (cannot happen for a valid plan)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
    return out, lse


def _run_backward(
    plan: SparsePlan, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (B, Tp, H, Dh): each call's kernel gets the merged output and log-sum-exp,
    which makes its gradients those of the softmax over the union of the calls' keys."""
    lay = _Layouts(plan, q)
    scale = q.shape[-1] ** -0.5
    lse = lse.masked_fill(torch.isneginf(lse), 0.0)  # rows without keys: P = 0 everywhere
    sums = plan.uses("sum", "usum", "sumtile")
    ks, vs = (lay.to_sum(k), lay.to_sum(v)) if sums else (None, None)
    acc: dict[str, Tensor] = {}  # "q", "k", "v" natural; "ks", "vs" summary

    def add(name: str, like: Tensor, call: TileCall, side: str, g: Tensor) -> None:
        """acc[name] += the call's gradient g at its ``side`` rows."""
        if name not in acc and _covers_all(
            call, side, lay
        ):  # the kernel's (B', H', T, Dh) is (B, Tp, H, Dh) already
            acc[name] = g.transpose(1, 2).reshape(like.shape)
            return
        if name not in acc:
            acc[name] = torch.zeros_like(like)
        view = (lay.q_view if side == "q" else lay.k_view)(call, acc[name])
        view += lay.from_kernel(g, view)

    for pc in plan.calls:
        call = pc.call
        qc, kc, vc = _operands(lay, call, q, k, v, ks, vs)
        gr = lay.dims(call, "q")
        do_c = lay.to_kernel(lay.q_view(call, dout), gr)
        o_c = lay.to_kernel(lay.q_view(call, out), gr)
        m_c = lay.to_kernel(lay.q_view(call, lse), gr).contiguous()
        mask = _fit(pc.mask, qc.shape[0], q.dtype)
        gq, gk, gv = _kernel_backward(do_c, qc, kc, vc, o_c, m_c, call.causal, mask, scale)
        add("q", q, call, "q", gq)
        natural_keys = call.kind in ("tile", "col")
        for name, g in (("k", gk), ("v", gv)):
            like = (k if natural_keys else ks) if name == "k" else (v if natural_keys else vs)
            key = name if natural_keys else name + "s"
            add(key, like, call, "k", g)
    dq, dk, dv = (acc.get(n) for n in "qkv")
    dq = torch.zeros_like(q) if dq is None else dq
    dk = torch.zeros_like(k) if dk is None else dk
    dv = torch.zeros_like(v) if dv is None else dv
    if "ks" in acc:
        lay.add_from_sum(dk, acc["ks"])
    if "vs" in acc:
        lay.add_from_sum(dv, acc["vs"])
    return dq, dk, dv


# The forward and the backward are registered operators (``torch.library.custom_op``) with fake
# implementations and a registered autograd formula, so that ``torch.compile`` and
# ``torch.export`` see one opaque op each instead of every tile call unrolled (which made a tiny
# model's inductor compile take minutes). The plan travels as its tensors (each call's mask and
# empty-row flags) and a string of its static structure (:func:`_structure`), decoded once
# per distinct plan (:func:`_decode`).


def _structure(plan: SparsePlan) -> str:
    """The plan's static structure as one string (plain formatting, which ``torch.compile``
    folds to a constant): ``seq_len;padded_len;stride;summary;n_heads;causal;bases;calls``, the
    bases comma-separated, each call ``kind:h0:h1:q0:q1:k0:k1:causal:rel:sub`` (``rel`` ``-``
    when none), calls separated by ``|``."""
    calls = "|".join(
        f"{c.kind}:{c.heads[0]}:{c.heads[1]}:{c.q[0]}:{c.q[1]}:{c.k[0]}:{c.k[1]}:"
        f"{int(c.causal)}:{c.rel or '-'}:{c.sub}"
        for c in (pc.call for pc in plan.calls)
    )
    bases = ",".join(str(x) for x in plan.bases)
    return (
        f"{plan.seq_len};{plan.padded_len};{plan.stride};{plan.summary};{plan.n_heads};"
        f"{int(plan.causal)};{bases};{calls}"
    )


@functools.lru_cache(maxsize=256)
def _decode(structure: str) -> tuple[dict, tuple[TileCall, ...]]:
    seq_len, padded_len, stride, summary, n_heads, causal, bases, calls = structure.split(";")
    d = {
        "seq_len": int(seq_len), "padded_len": int(padded_len), "stride": int(stride),
        "summary": int(summary), "n_heads": int(n_heads), "causal": causal == "1",
        "bases": tuple(int(x) for x in bases.split(",")) if bases else (),
    }  # fmt: skip
    parsed = []
    for text in calls.split("|") if calls else []:
        kind, h0, h1, q0, q1, k0, k1, c, rel, sub = text.split(":")
        parsed.append(TileCall(kind, (int(h0), int(h1)), (int(q0), int(q1)), (int(k0), int(k1)),
                               causal=c == "1", rel=None if rel == "-" else rel, sub=int(sub)))  # fmt: skip
    return d, tuple(parsed)


def _plan(structure: str, masks: list, empties: list) -> SparsePlan:
    d, calls = _decode(structure)
    prepared = tuple(PreparedCall(c, m, e) for c, m, e in zip(calls, masks, empties))
    return SparsePlan(**d, calls=prepared)


@torch.library.custom_op("effiformer::tiled_sparse_forward", mutates_args=())
def _forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    masks: list[Tensor | None],
    empties: list[Tensor | None],
    structure: str,
) -> tuple[Tensor, Tensor]:
    """(out (B, Tp, H, Dh), lse (B, Tp, H)) of the plan ``structure`` describes."""
    out, lse = _run_forward(_plan(structure, masks, empties), q, k, v)
    return out.contiguous(), lse.contiguous()


@_forward_op.register_fake
def _(q, k, v, masks, empties, structure):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3])


@torch.library.custom_op("effiformer::tiled_sparse_backward", mutates_args=())
def _backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    masks: list[Tensor | None],
    empties: list[Tensor | None],
    structure: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (B, Tp, H, Dh)."""
    plan = _plan(structure, masks, empties)
    dq, dk, dv = _run_backward(plan, q, k, v, out, lse, dout)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, masks, empties, structure):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, masks, empties, structure = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.masks, ctx.empties, ctx.structure = masks, empties, structure
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _backward_op(
        dout.contiguous(), q, k, v, out, lse, ctx.masks, ctx.empties, ctx.structure
    )
    return dq, dk, dv, _no_grads(ctx.masks), _no_grads(ctx.empties), None


def _no_grads(items: list) -> list | None:
    """No gradient for a list input, shaped as torch.library flattened it: a list holding a
    ``None`` is one leaf, a list of tensors one leaf per tensor."""
    return None if any(t is None for t in items) else [None] * len(items)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, plan: SparsePlan) -> Tensor:
    """Sparse attention of ``plan`` over q, k, v (B, T, H, Dh) -> (B, T, H, Dh), computed tile by
    tile and merged by log-sum-exp (see the module docstring); differentiable."""
    b, t, h, dh = q.shape
    if t != plan.seq_len or h != plan.n_heads:
        raise ValueError(
            f"q has T={t}, H={h} but the plan was prepared for T={plan.seq_len}, H={plan.n_heads}"
        )
    if plan.key_padding is not None and plan.key_padding.shape[0] not in (1, b):
        raise ValueError(
            f"the plan's key padding has batch {plan.key_padding.shape[0]}, q has batch {b}"
        )
    pad = plan.padded_len - t
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))  # (B, Tp, H, Dh)
    else:
        q, k, v = (x.contiguous() for x in (q, k, v))
    masks = [pc.mask for pc in plan.calls]
    empties = [pc.empty for pc in plan.calls]
    out, _ = _forward_op(q, k, v, masks, empties, _structure(plan))
    return out[:, :t] if pad else out
