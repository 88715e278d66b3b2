"""Sparse Transformer: factorized strided and fixed self-attention.

Child, Gray, Radford, Sutskever 2019, "Generating Long Sequences with Sparse Transformers",
arXiv 1904.10509, section 4 (factorized self-attention): section 4.2 (the two-step
factorizations A^(1), A^(2)), section 4.3 (the three ways of combining them: eq. 5
interleaved, eq. 6 merged heads, eq. 7 heads split between the patterns), section 5.5 (the
block-sparse kernels: strided attention computed on the transposed (n/l, l) grid). The official
attention code is openai/sparse_attention (``attention.py``: ``get_attn_mask``,
``strided_transpose``, ``get_blocksparse_obj`` with ``num_verts``/``vertsize``).

The patterns, for query ``i`` and key ``j`` (stride ``l``, summary length ``c``):

======== ===================================== ==================================================
pattern  A^(1)                                 A^(2)
======== ===================================== ==================================================
strided  ``i - l < j <= i``  (the previous l)  ``(i - j) mod l == 0``, ``j <= i``
fixed    ``j // l == i // l``, ``j <= i``      ``j mod l`` in head h's summary sub-block, ``j <= i``
======== ===================================== ==================================================

Bidirectional (``causal=False``) versions drop ``j <= i``: strided A^(1) becomes
``|i - j| < l``. Fixed summary sub-blocks (official ``num_verts``/``vertsize``): the block of
``l`` positions is cut into sub-blocks of ``c`` counted from its end; head ``h`` takes sub-block
``a = h mod num_verts``, the positions ``l - (a+1) c .. l - a c - 1`` of every block
(``num_verts=1``: every head takes the last ``c`` positions, ``l - c .. l - 1``, as the code does).
With heads split between the patterns the a-th head on A^(2) takes sub-block ``a mod num_verts``.

``combine``: ``"merged"`` (every head attends over A^(1) ∪ A^(2), eq. 6; the official "fixed"
mode), ``"interleaved"`` (layer ``r`` uses A^(r mod 2), eq. 5, through
:meth:`SparseConfig.for_layer`), ``"split"`` (the first ``H - H//2`` heads on A^(1), the others
on A^(2), eq. 7), or ``"a1"`` / ``"a2"`` (one step only; what interleaving builds per layer).

Deliberate choices and deviations
---------------------------------
- **A^(1) has l elements** (``i - l < j <= i``), the official code's ``local`` window
  (``bandwidth = local_attn_ctx``); the paper writes ``{max(0, i-l), ..., i}`` (l + 1 elements).
  Merged heads see the same set either way (the paper's extra key ``i - l`` is in A^(2)).
- A query with no key in its pattern (fixed A^(2) alone, before the first summary position; a
  row whose keys are all padding) outputs 0; the paper's model never has such rows (merged
  heads always hold the query itself).
- Patterns are exact at the element level: ``c`` need not be a multiple of a kernel block (the
  official layout works in blocks of 32, so there ``c`` must be).
- No attention-weight dropout in the tiled path (the paper applies dropout only at the residual
  additions); ``attn_dropout > 0`` needs ``impl="dense"``.
- fp16 activations with loss scaling (paper section 5.6) are the trainer's concern, not here.

How it is computed (``impl="tiled"``, the default)
--------------------------------------------------
A block mask over the natural order saves nothing for A^(2): every l-th earlier position, and the
last c positions of every block, touch every key block. So, like the paper's kernels, each step
is arranged as *dense attention over contiguous tiles* and the steps are merged by their
log-sum-exp (:func:`tiled_attention`):

- strided A^(1): the sequence cut into tiles of ``l``; tile ``r`` against itself (causal) and
  against tile ``r-1`` (keys ``kj > qi``; bidirectional: and tile ``r+1``, ``kj < qi``);
- strided A^(2): the columns of the (n/l, l) grid (the sequence reshaped and transposed, paper
  section 5.5 and ``strided_transpose``): causal attention within each column of n/l positions;
- fixed A^(1): tile ``r`` against itself;
- fixed A^(2), causal, c dividing l: the summary positions gathered per head (n c / l keys);
  the queries regrouped into l/c sequences by their in-block offset (query ``r l + u c + v``
  at row ``r c + v`` of sequence ``u``), each of which attends to the summaries with one dense
  causal call shifted by c (exactly the pattern's pairs), plus a (l x c) tile call for the rest
  of the previous block's summary; otherwise (bidirectional, or c not dividing l) query tiles
  are grouped (about sqrt(n/l) groups), each group dense against the summaries it sees whole
  and masked against its own.

How the calls run (views, the exact log-sum-exp merge, what the backward keeps) is the kernel's:
:mod:`effiformer.ops.tiled_sparse`. In the code ``st`` is the stride l (ruff forbids ``l``). Layouts (tiles, masks, gather indices) are built in
:meth:`SparseAttention.prepare` once per forward; their padding-free parts are cached per shape.
``impl="flex"`` (CUDA, or forward only on a CPU) runs the same pattern as FlexAttention block
masks (:mod:`effiformer.ops.flex_patterns`).

``impl="dense"`` computes the same pattern as a dense boolean mask (:func:`pattern_mask`) with
SDPA: the O(n^2) reference the tests compare the tiled path against.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import AttentionConfig, ConfigError
from ..ops.flex_patterns import (
    flex_pattern_attention,
    flex_unavailable,
    masked_mod,
    pattern_block_mask,
)
from ..ops.reference import masked_attention
from ..ops.tiled_sparse import PreparedCall, SparsePlan, TileCall, summary_index, tiled_attention
from ..ops.tracing import can_read_values, tracing
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
)
from .dense import DenseAttention
from .registry import register_attention

__all__ = [
    "PATTERNS",
    "COMBINES",
    "SparseConfig",
    "SparseAttention",
    "SparsePlan",
    "head_roles",
    "pattern_mask",
    "tiled_attention",
    "masked_attention",
]

logger = logging.getLogger(__name__)

PATTERNS = ("strided", "fixed")
COMBINES = ("merged", "interleaved", "split", "a1", "a2")
IMPLS = ("tiled", "dense", "flex")


@dataclass(frozen=True, kw_only=True)
class SparseConfig(AttentionConfig):
    """Factorized sparse attention (Child et al. 2019).

    pattern: ``"strided"`` or ``"fixed"``; stride: ``l``, the tile length (~sqrt(n));
    summary: ``c``, the summary length of the fixed pattern; num_verts: how many distinct
    length-``c`` summary sub-blocks the heads cycle through (fixed; ``num_verts * c <= l``);
    combine: ``"merged"``, ``"interleaved"``, ``"split"``, ``"a1"`` or ``"a2"`` (see the module
    docstring); impl: ``"tiled"`` (O(n sqrt n); on CUDA it runs through FlexAttention's block
    masks, :mod:`effiformer.ops.flex_patterns`), ``"dense"`` (masked O(n^2) reference) or
    ``"flex"`` (FlexAttention on any device: on the CPU forward only, for inference and tests);
    bias: biases on the Q, K, V, O projections.
    """

    name = "sparse"

    pattern: str = "fixed"
    stride: int = 128
    summary: int = 32
    num_verts: int = 1
    combine: str = "merged"
    impl: str = "tiled"
    bias: bool = True

    def __post_init__(self) -> None:
        self._check_choice("pattern", PATTERNS)
        self._check_choice("combine", COMBINES)
        self._check_choice("impl", IMPLS)
        for f in ("stride", "summary", "num_verts"):
            self._check_positive(f)
        if self.pattern == "fixed" and self.summary * self.num_verts > self.stride:
            raise ConfigError(
                f"attention.summary * attention.num_verts must be <= attention.stride (the "
                f"summary sub-blocks lie inside a block), got {self.summary} * {self.num_verts} > "
                f"{self.stride}"
            )

    def for_layer(self, layer: int, n_layers: int) -> SparseConfig:
        """Interleaved patterns (eq. 5): layer ``r`` attends over A^(r mod 2 + 1)."""
        if self.combine != "interleaved":
            return self
        return dataclasses.replace(self, combine="a1" if layer % 2 == 0 else "a2")


# ------------------------------------------------------------------------------ the pattern


@dataclass(frozen=True)
class HeadRole:
    """What one head attends over: A^(1), A^(2) (with its summary sub-block), or both."""

    a1: bool
    a2: bool
    sub_block: int = 0


def head_roles(config: SparseConfig, n_heads: int) -> tuple[HeadRole, ...]:
    """Per head: which steps it attends over and its fixed-pattern summary sub-block."""
    combine = config.combine
    if combine == "interleaved":
        raise ValueError("an interleaved config is resolved per layer: use config.for_layer(...)")
    nv = config.num_verts
    if combine == "split":
        n1 = n_heads - n_heads // 2
        return tuple(
            HeadRole(True, False) if h < n1 else HeadRole(False, True, (h - n1) % nv)
            for h in range(n_heads)
        )
    a1, a2 = combine in ("merged", "a1"), combine in ("merged", "a2")
    return tuple(HeadRole(a1, a2, h % nv) for h in range(n_heads))


def pattern_mask(config: SparseConfig, seq_len: int, n_heads: int, *, causal: bool) -> Tensor:
    """The pattern as a dense keep-mask (H, T, T), True = query i attends key j: the elementwise
    definitions of the module docstring, independent of the tiled layouts."""
    t = seq_len
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    st, c = config.stride, config.summary
    ok = (j <= i) if causal else torch.ones(t, t, dtype=torch.bool)
    if config.pattern == "strided":
        a1 = ((i - j) < st) & ((j - i) < st)
        a2 = ((i - j) % st) == 0
        a2s = [a2] * n_heads
    else:
        a1 = (i // st) == (j // st)
        a2s = []
        for role in head_roles(config, n_heads):
            lo = st - (role.sub_block + 1) * c
            a2s.append(((j % st) >= lo) & ((j % st) < lo + c))
    out = []
    for role, a2 in zip(head_roles(config, n_heads), a2s):
        keep = torch.zeros(t, t, dtype=torch.bool)
        if role.a1:
            keep |= a1
        if role.a2:
            keep |= a2
        out.append(keep & ok)
    return torch.stack(out)  # (H, T, T)


def pattern_mask_mod(
    config: SparseConfig,
    n_heads: int,
    *,
    causal: bool,
    key_padding: Tensor | None = None,
    device: torch.device | str = "cpu",
):
    """The pattern as a FlexAttention ``mask_mod`` ``(b, h, q_idx, kv_idx) -> bool``: the same
    elementwise definitions as :func:`pattern_mask`, per head role; ``key_padding`` (B, T) bool,
    True = a real key."""
    st, c = config.stride, config.summary
    roles = head_roles(config, n_heads)
    a1 = torch.tensor([r.a1 for r in roles], device=device)
    a2 = torch.tensor([r.a2 for r in roles], device=device)
    lo = torch.tensor([st - (r.sub_block + 1) * c for r in roles], device=device)
    strided = config.pattern == "strided"

    def pattern(b, h, q_idx, kv_idx):
        if strided:
            m1 = ((q_idx - kv_idx) < st) & ((kv_idx - q_idx) < st)
            m2 = ((q_idx - kv_idx) % st) == 0
        else:
            m1 = (q_idx // st) == (kv_idx // st)
            r = kv_idx % st
            m2 = (r >= lo[h]) & (r < lo[h] + c)
        return (a1[h] & m1) | (a2[h] & m2)

    kp = None if key_padding is None else key_padding.to(device)
    return masked_mod(pattern, causal=causal, key_padding=kp)


def _head_ranges(roles: tuple[HeadRole, ...], step: str) -> list[tuple[int, int]]:
    """Maximal runs of heads whose role includes ``step`` ("a1"/"a2"); A^(2) runs also keep
    merged heads (A^(1) too) apart from A^(2)-only ones."""
    runs: list[tuple[int, int]] = []
    for h, r in enumerate(roles):
        if not (r.a1 if step == "a1" else r.a2):
            continue
        if runs and runs[-1][1] == h and (step == "a1" or roles[h - 1].a1 == r.a1):
            runs[-1] = (runs[-1][0], h + 1)
        else:
            runs.append((h, h + 1))
    return runs


def _structure(config: SparseConfig, n_heads: int, n_tiles: int, causal: bool) -> list[TileCall]:
    """The tile calls of a pattern, disjoint per (query, head) so their union is the pattern."""
    roles = head_roles(config, n_heads)
    nt = n_tiles
    calls: list[TileCall] = []
    for hs in _head_ranges(roles, "a1"):
        calls.append(TileCall("tile", hs, (0, nt), (0, nt), causal=causal))
        if config.pattern == "strided" and nt > 1:
            calls.append(TileCall("tile", hs, (1, nt), (0, nt - 1), rel="after"))
            if not causal:
                calls.append(TileCall("tile", hs, (0, nt - 1), (1, nt), rel="before"))
    for hs in _head_ranges(roles, "a2"):
        merged = roles[hs[0]].a1
        if config.pattern == "fixed":
            calls.extend(_summary_calls(config, hs, nt, causal, merged))
        elif causal and merged:  # j = i is in A1: column rows r' <= r - 1
            if nt > 1:
                calls.append(TileCall("col", hs, (1, nt), (0, nt - 1), causal=True))
        elif causal:
            calls.append(TileCall("col", hs, (0, nt), (0, nt), causal=True))
        else:
            calls.append(TileCall("col", hs, (0, nt), (0, nt), rel="not_self" if merged else None))
    return calls


def _summary_calls(
    config: SparseConfig, hs: tuple[int, int], nt: int, causal: bool, merged: bool
) -> list[TileCall]:
    """Fixed A^(2) (summary tiles s of query tile r: s < r merged, also this tile's summary up
    to the query alone; bidirectional s != r merged, every s alone).

    Causal with c | l: the queries regrouped as l/c sequences (query ``r l + u c + v`` at row
    ``r c + v`` of sequence u) each meet the n c / l summary keys (key ``s c + w``) in one dense
    top-left causal call shifted by c (keeps s < r - 1, and s = r - 1 with w <= v), plus a tile
    call for the rest of summary tile r - 1 (w > v). Otherwise query tiles are grouped ~sqrt(nt) at a time, each
    group dense against the summaries it fully sees and masked against its own."""
    st, c = config.stride, config.summary
    n = nt * c
    if not causal and not merged:  # every query sees every summary position
        return [TileCall("sum", hs, (0, nt * st), (0, n))]
    if causal and st % c == 0:
        calls = []
        if nt > 1:
            for sub in range(st // c):
                calls.append(TileCall("usum", hs, (c, n), (0, n - c), causal=True, sub=sub))
            calls.append(TileCall("sumtile", hs, (1, nt), (0, nt - 1), rel="sum_prev"))
        if not merged:
            calls.append(TileCall("sumtile", hs, (0, nt), (0, nt), rel="sum_own"))
        return calls
    n_groups = math.ceil(math.sqrt(nt))
    m = math.ceil(nt / n_groups)
    calls = []
    for t0 in range(0, nt, m):
        t1 = min(nt, t0 + m)
        qs = (t0 * st, t1 * st)
        if t0 > 0:
            calls.append(TileCall("sum", hs, qs, (0, t0 * c)))
        if not causal and t1 < nt:
            calls.append(TileCall("sum", hs, qs, (t1 * c, n)))
        rel = ("sum_strict" if merged else "sum_causal") if causal else "sum_other"
        calls.append(TileCall("sum", hs, qs, (t0 * c, t1 * c), rel=rel))
    return calls


def _call_dims(call: TileCall, st: int, c: int) -> tuple[int, int]:
    """(Tq, Tk) of one call."""
    if call.kind == "tile":
        return st, st
    if call.kind == "sumtile":
        return st, c
    return call.q[1] - call.q[0], call.k[1] - call.k[0]


def _structural_keep(
    call: TileCall, st: int, c: int, bases: Tensor, device: torch.device
) -> Tensor | None:
    """The call's structural keep-mask, broadcastable to (B', H', Tq, Tk), or None."""
    rel = call.rel
    if rel is None:
        return None
    tq, tk = _call_dims(call, st, c)
    qi = torch.arange(tq, device=device)[:, None]
    kj = torch.arange(tk, device=device)[None, :]
    if rel in ("after", "before", "not_self"):
        keep = {"after": kj > qi, "before": kj < qi, "not_self": kj != qi}[rel]
        return keep[None, None]  # (1, 1, Tq, Tk)
    h0, h1 = call.heads
    if rel == "sum_prev":  # summary tile r - 1 minus what the u-call took (w <= v)
        return (kj > qi % c)[None, None]
    if rel == "sum_own":  # this tile's own summary positions up to the query (per head)
        return (bases[h0:h1, None, None] + kj[None] <= qi[None])[None]  # (1, H', st, c)
    qpos = torch.arange(*call.q, device=device)  # (Tq,)
    kidx = torch.arange(*call.k, device=device)  # (Tk,)
    r = (qpos // st)[:, None]  # query tile
    s = (kidx // c)[None, :]  # key tile
    if rel == "sum_strict":
        return (s < r)[None, None]
    if rel == "sum_other":
        return (s != r)[None, None]
    # "sum_causal": earlier tiles, and this tile's summary positions up to the query (per head)
    kpos = (kidx // c) * st + (kidx % c)  # (Tk,) position minus the head's base
    kpos = kpos[None, None, :] + bases[h0:h1, None, None]  # (H', 1, Tk)
    causal = kpos <= qpos[None, :, None]  # (H', Tq, Tk)
    return ((s < r)[None] | ((s == r)[None] & causal))[None]  # (1, H', Tq, Tk)


def _prepare_call(
    call: TileCall, keep: Tensor | None, dims: tuple[int, int], dtype: torch.dtype
) -> PreparedCall:
    """The additive mask and the rows without keys of a call from its keep-mask. Causal calls
    carry only key padding (B', 1 | H', 1, Tk); the kernel applies the triangle."""
    if keep is None:
        return PreparedCall(call, None, None)
    mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
        ~keep, float("-inf")
    )
    if call.causal:  # row qi sees keys 0..qi: empty when none of them is real
        tq, tk = dims
        seen = keep[..., 0, :].to(torch.uint8).cummax(-1).values.to(torch.bool)  # (B', ., Tk)
        idx = torch.arange(tq, device=keep.device).clamp(max=tk - 1)
        empty = ~seen[..., idx]  # (B', ., Tq)
    else:
        empty = ~keep.any(-1)
    # no row empty (known only where the mask can be read): the kernel skips the zeroing
    return PreparedCall(
        call, mask, None if can_read_values(empty) and not bool(empty.any()) else empty
    )


@functools.lru_cache(maxsize=64)
def _structural_plan(
    config: SparseConfig,
    n_heads: int,
    padded_len: int,
    causal: bool,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[tuple[PreparedCall, ...], tuple[int, ...]]:
    """The padding-free plan of a shape (cached: built once per shape, reused every forward)."""
    st, c = config.stride, config.summary
    roles = head_roles(config, n_heads)
    bases = tuple(st - (r.sub_block + 1) * c for r in roles)
    base_t = torch.tensor(bases, device=device)
    out = []
    for call in _structure(config, n_heads, padded_len // st, causal):
        keep = _structural_keep(call, st, c, base_t, device)
        out.append(_prepare_call(call, keep, _call_dims(call, st, c), dtype))
    return tuple(out), bases


def _padding_keep(call: TileCall, kp: Tensor, ks: Tensor | None, st: int, c: int) -> Tensor:
    """Key padding of a call's keys as a keep-mask (B', 1 | H', 1, Tk). kp: (B, Tp) bool;
    ks: (B, nt*c, H) bool, the padding of the gathered summary keys."""
    b = kp.shape[0]
    nt = kp.shape[1] // st
    (k0, k1), (h0, h1) = call.k, call.heads
    if call.kind == "tile":
        return kp.view(b, nt, st)[:, k0:k1].reshape(b * (k1 - k0), 1, 1, st)
    if call.kind == "col":
        cols = kp.view(b, nt, st).transpose(1, 2)[:, :, k0:k1]  # (B, l, n)
        return cols.reshape(b * st, 1, 1, k1 - k0)
    assert ks is not None
    if call.kind == "sumtile":
        t = ks.view(b, nt, c, -1)[:, k0:k1, :, h0:h1].reshape(b * (k1 - k0), c, h1 - h0)
        return t.permute(0, 2, 1)[:, :, None, :]  # (B n, H', 1, c)
    return ks[:, k0:k1, h0:h1].permute(0, 2, 1)[:, :, None, :]  # (B, H', 1, Tk)


def build_plan(
    config: SparseConfig,
    n_heads: int,
    seq_len: int,
    *,
    causal: bool,
    key_padding: Tensor | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> SparsePlan:
    """The plan of one forward over ``seq_len`` tokens (``key_padding``: (B, T), True = real)."""
    device = torch.device(device)
    if config.combine == "interleaved":
        raise ValueError("an interleaved config is resolved per layer: use config.for_layer(...)")
    if config.combine == "split" and n_heads < 2:
        raise ConfigError(f"attention.combine='split' needs n_heads >= 2, got {n_heads}")
    st, c = config.stride, config.summary
    tp = -(-seq_len // st) * st
    if config.impl == "flex" or (config.impl == "tiled" and device.type == "cuda"):
        if flex_unavailable(torch.empty(0, device=device), needs_grad=False) is None:
            mask_mod = pattern_mask_mod(
                config, n_heads, causal=causal, key_padding=key_padding, device=device
            )
            b = None if key_padding is None else key_padding.shape[0]
            bm = pattern_block_mask(mask_mod, b, n_heads, seq_len, seq_len, device)
            return SparsePlan(seq_len, seq_len, st, c, n_heads, causal, block_mask=bm)
    if config.impl == "dense":
        keep = pattern_mask(config, seq_len, n_heads, causal=causal).to(device)[None]
        if key_padding is not None:
            keep = keep & key_padding[:, None, None, :].to(device=device, dtype=torch.bool)
        return SparsePlan(seq_len, seq_len, st, c, n_heads, causal, dense_keep=keep)
    # while tracing, the masks are the tracer's (fake) tensors: never cached for eager calls
    build = _structural_plan.__wrapped__ if tracing() else _structural_plan
    calls, bases = build(config, n_heads, tp, causal, device, dtype)
    kp = None
    if key_padding is not None or (tp > seq_len and not causal):
        # Causal: the tail padding sits after every real query, so no real query sees it.
        b = key_padding.shape[0] if key_padding is not None else 1
        kp = torch.ones(b, tp, dtype=torch.bool, device=device)
        kp[:, seq_len:] = False
        if key_padding is not None:
            kp[:, :seq_len] = key_padding.to(device=device, dtype=torch.bool)
        ks = None
        if config.pattern == "fixed":
            idx = summary_index(bases, c, device)[..., 0]  # (1, 1, c, H)
            grid = kp.view(b, tp // st, st, 1).expand(-1, -1, -1, n_heads)
            ks = torch.gather(grid, 2, idx.expand(b, tp // st, -1, -1))
            ks = ks.reshape(b, (tp // st) * c, n_heads)  # (B, nt*c, H)
        base_t = torch.tensor(bases, device=device)
        padded = []
        for pc in calls:
            keep = _padding_keep(pc.call, kp, ks, st, c)
            struct = _structural_keep(pc.call, st, c, base_t, device)
            if struct is not None:
                keep = keep & struct
            padded.append(_prepare_call(pc.call, keep, _call_dims(pc.call, st, c), dtype))
        calls = tuple(padded)
    return SparsePlan(seq_len, tp, st, c, n_heads, causal, calls, bases, key_padding=kp)


# ------------------------------------------------------------------------------ the part


class SparseAttention(DenseAttention):
    """Factorized sparse self-attention (see the module docstring) with dense Q, K, V, O
    projections. forward(x (B, T, D), *, mask) -> AttentionOutput(out (B, T, D)); ``kv`` and
    ``state`` must be ``None`` (the pattern is over one sequence; no decoding cache)."""

    # The dense parent's KV cache does not apply: the pattern is over one whole sequence, so this
    # part keeps no decoding state and generation recomputes the window for every new token.
    init_decoding_state = AttentionPart.init_decoding_state
    reorder_decoding_state = AttentionPart.reorder_decoding_state

    config: SparseConfig

    @classmethod
    def from_config(cls, config: SparseConfig, dims: AttentionDims) -> SparseAttention:
        if config.impl in ("tiled", "flex") and dims.dropout > 0:
            raise ConfigError(
                f"attention.impl={config.impl!r} has no attention-weight dropout (the paper applies "
                f"dropout only at the residual additions); got attn_dropout={dims.dropout}: set "
                "it to 0 or use attention.impl=dense"
            )
        if config.combine == "split" and dims.n_heads < 2:
            raise ConfigError(f"attention.combine='split' needs n_heads >= 2, got {dims.n_heads}")
        m = cls(dims.dim, dims.n_heads, dims.head_dim, dropout=dims.dropout, bias=config.bias)
        m.config, m.dims = config, dims
        return m

    def prepare(self, ctx: PrepareContext, shared: None) -> SparsePlan:
        if ctx.tq != ctx.tk or ctx.q_positions is not None or ctx.k_positions is not None:
            raise ValueError(
                "sparse attention is self-attention over one sequence (Tq == Tk, default "
                f"positions); got Tq={ctx.tq}, Tk={ctx.tk} (a memory or cross-attention?)"
            )
        return build_plan(
            self.config,
            self.dims.n_heads,
            ctx.tq,
            causal=ctx.mask.causal,
            key_padding=ctx.mask.key_padding,
            device=ctx.device,
            dtype=ctx.dtype,
        )

    @classmethod
    def example_config(cls, config: SparseConfig, seq_len: int) -> SparseConfig:
        st = max(2, math.isqrt(seq_len))
        return dataclasses.replace(config, stride=st, summary=max(1, st // 4), num_verts=2)

    @classmethod
    def degenerate_config(cls, config: SparseConfig, seq_len: int) -> SparseConfig:
        # One block covers the sequence: A1 alone is dense (causal or not) and A2 adds nothing.
        return dataclasses.replace(config, stride=max(config.stride, seq_len), combine="merged")

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: SparsePlan | None = None,
    ) -> AttentionOutput:
        if kv is not None:
            raise ValueError("sparse attention is self-attention: pass kv=None")
        if state is not None:
            raise ValueError("sparse attention keeps no decoding state: pass state=None")
        check_attention_inputs(x, None, self.dim, mask)
        b, t, _ = x.shape
        mask = mask if mask is not None else AttentionMask()
        plan = positions
        if plan is None:
            ctx = PrepareContext(tq=t, tk=t, mask=mask, device=x.device, dtype=x.dtype)
            plan = self.prepare(ctx, None)
        if not isinstance(plan, SparsePlan):
            raise ValueError(f"positions must be a SparsePlan, got {type(plan).__name__}")
        if plan.causal != mask.causal or plan.seq_len != t:
            raise ValueError(
                f"the plan was prepared for T={plan.seq_len}, causal={plan.causal}; got T={t}, "
                f"causal={mask.causal}"
            )
        h, dh = self.n_heads, self.head_dim
        q, k, v = (p(x).view(b, t, h, dh) for p in (self.q_proj, self.k_proj, self.v_proj))
        if plan.block_mask is not None:
            qh, kh, vh = (z.transpose(1, 2) for z in (q, k, v))  # (B, H, T, Dh)
            o = flex_pattern_attention(qh, kh, vh, plan.block_mask).transpose(1, 2)
        elif plan.dense_keep is not None:
            p = self.dropout if self.training else 0.0
            keep = plan.dense_keep.to(x.device)
            o = masked_attention(*(z.transpose(1, 2) for z in (q, k, v)), keep, p)
            o = o.transpose(1, 2)  # (B, T, H, Dh)
        else:
            o = tiled_attention(q, k, v, plan)  # (B, T, H, Dh)
        return AttentionOutput(out=self.o_proj(o.reshape(b, t, h * dh)))


register_attention(
    "sparse",
    SparseConfig,
    SparseAttention,
    description="factorized strided/fixed attention, O(n sqrt n) tiles (Child et al. 2019)",
)
