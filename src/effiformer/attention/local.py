"""Local (chunked) attention: each query attends to its own chunk and its neighbours.

The sequence is cut into chunks of ``window`` tokens; queries of chunk ``n`` attend to the keys
of chunks ``n - look_backward ... n + look_forward``, under the causal mask on original
positions when the model is causal. This is the companion layer of the Reformer (Kitaev, Kaiser,
Levskaya 2020, arXiv 2001.04451, sec. 3 and the enwik8 recipe's local layers: a chunk attends to
itself and the previous chunk) and the local heads of the Routing Transformer (Roy, Saffar,
Vaswani, Grangier 2020, arXiv 2003.05997, sec. 4: "local attention ... own block causally plus the
previous block"). It is also what the public ``local-attention`` package computes
(``window_size``, ``look_backward``, ``look_forward``).

Cost: O(T * window * (1 + look_backward + look_forward)) time and memory per head, never
O(T^2). Two implementations of the same attention (``local_attention(strided=...)``):

- *strided* (CPU, float32/64, no dropout, no key padding; the default where it applies): each
  chunk's neighbourhood is a contiguous range of positions, so its keys and values are read in
  place as an overlapping strided view of the (B, T, H, Dh) input by the CPU flash-attention
  kernel that SDPA itself runs; a custom autograd node keeps q, k, v, the output and the
  log-sum-exp only and runs that kernel's backward (scores recomputed block by block, as SDPA's
  backward does), folding the neighbour gradients back group by group
  (:mod:`effiformer.ops.strided_local`). The chunks at the ends,
  whose neighbourhood is cut by the sequence, go one by one with their key range clipped (the
  first chunk then computes w instead of 2w key columns: fewer FLOPs, same result).
- *gathered* (any device, dropout, key padding): the neighbour keys and values are copied into
  a (chunks, (1 + b + f) * window) tile and one SDPA call handles every chunk; its autograd
  node keeps those tiles (2-3x the size of k and v).

Deviations / choices: a sequence that is not a multiple of ``window`` is padded at the end (the
padded keys are masked, the padded queries dropped); the neighbours of the first/last chunks that
do not exist are masked, not wrapped around. ``look_forward`` defaults to 0 for causal models and
1 for bidirectional ones (the package's defaults).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from ..ops.flex_patterns import (
    flex_pattern_attention,
    flex_unavailable,
    masked_mod,
    pattern_block_mask,
)
from ..ops.strided_local import strided_local_attention, strided_unavailable
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
)
from .registry import register_attention
from .relative import RelativeTables, relative_attention

__all__ = [
    "LocalConfig",
    "LocalAttention",
    "local_attention",
    "LocalPlan",
    "make_plan",
    "strided_unavailable",
]


@dataclass(frozen=True, kw_only=True)
class LocalConfig(AttentionConfig):
    """``window``: chunk length; ``look_backward`` / ``look_forward``: neighbouring chunks each
    chunk attends to (``look_forward=None``: 0 when causal, 1 when bidirectional); ``bias``:
    biases on the Q, K, V, O projections."""

    name = "local"

    window: int = 256
    look_backward: int = 1
    look_forward: int | None = None
    bias: bool = True

    def __post_init__(self) -> None:
        self._check_positive("window")
        if isinstance(self.look_backward, bool) or self.look_backward < 0:
            raise ConfigError(f"attention.look_backward must be >= 0, got {self.look_backward!r}")
        if self.look_forward is not None and (
            isinstance(self.look_forward, bool) or self.look_forward < 0
        ):
            raise ConfigError(
                f"attention.look_forward must be None or >= 0, got {self.look_forward!r}"
            )


@dataclass(frozen=True)
class LocalPlan:
    """What one forward's local attention shares across layers (built in ``prepare``).

    window / n_chunks / padded: chunk length, number of chunks, T rounded up to chunks;
    offsets: the chunk offsets each chunk attends to (``-look_backward .. look_forward``);
    length / causal: the sequence length T and the mask's causality;
    valid: (n_chunks, len(offsets) * window) bool, which neighbour keys exist (chunk in range,
    position < T); rel: (window, len(offsets) * window) bool, the causal mask relative to the
    chunk (``None`` when not causal); ``keep`` (n_chunks, window, len(offsets) * window), their
    conjunction, is built on first use only (the gathered path needs it, the strided one not);
    regular_from: ``r`` when every chunk from ``r`` on has the same mask ``keep[r]`` (a causal
    plan whose length is a multiple of the window: every chunk but the first ``look_backward``),
    else ``None``. Without key padding those chunks then share one (w, K) mask instead of a
    (chunks, w, K) one (less memory: SDPA keeps its mask for the backward).
    """

    window: int
    n_chunks: int
    padded: int
    offsets: tuple[int, ...]
    length: int
    causal: bool
    valid: Tensor
    rel: Tensor | None
    regular_from: int | None = None

    @functools.cached_property
    def keep(self) -> Tensor:
        """(n_chunks, w, K) bool: causal and range mask on original positions."""
        n, kk = self.valid.shape
        keep = self.valid[:, None, :].expand(n, self.window, kk)
        if self.rel is not None:
            keep = keep & self.rel[None]
        return keep.contiguous()


def make_plan(
    t: int, window: int, look_backward: int, look_forward: int, *, causal: bool, device=None
) -> LocalPlan:
    w = min(window, t) if t > 0 else window
    n = -(-t // w)
    offsets = tuple(range(-look_backward, look_forward + 1))
    off = torch.tensor(offsets, device=device)  # (len(offsets),)
    chunk = torch.arange(n, device=device)[:, None] + off[None]  # (n, len(offsets))
    exists = (chunk >= 0) & (chunk < n)
    kpos = (chunk[:, :, None] * w + torch.arange(w, device=device)).reshape(n, -1)  # (n, K)
    valid = exists[:, :, None].expand(n, len(offsets), w).reshape(n, -1) & (kpos < t)  # (n, K)
    rel = None
    if causal:
        # key at offset o, row j of its chunk vs query row i: o * w + j <= i
        krel = (off[:, None] * w + torch.arange(w, device=device)).reshape(-1)  # (K,)
        rel = krel[None, :] <= torch.arange(w, device=device)[:, None]  # (w, K)
    regular = _regular_from(t, w, look_backward, look_forward, causal)
    return LocalPlan(w, n, n * w, offsets, t, causal, valid, rel, regular)


def _regular_from(t: int, w: int, back: int, fwd: int, causal: bool) -> int | None:
    """The first chunk from which every chunk has the same mask (its neighbours all exist and hold
    no padding, on the columns some query of the chunk can see), or None: ``back`` when chunks
    ``back ... n - 1`` agree. From the integers alone (no tensor is read: one graph under
    ``torch.compile``). Only the last ``fwd + 1`` chunks can differ from chunk ``back`` (a
    forward neighbour past the end, or the padded last chunk among the neighbours); under the
    causal mask no query sees a forward neighbour."""
    n = -(-t // w)
    if n <= back:
        return None
    seen_offsets = range(-back, 1) if causal else range(-back, fwd + 1)

    def row(c: int) -> tuple[int, ...]:  # visible keys per offset (a count: positions are a prefix)
        return tuple(max(0, min(w, t - (c + o) * w)) if 0 <= c + o < n else 0 for o in seen_offsets)

    first = row(back)
    tail = range(max(back, n - 1 - (0 if causal else fwd)), n)
    return back if all(row(c) == first for c in tail) else None


def _neighbours(t: Tensor, offsets: tuple[int, ...]) -> Tensor:
    """(B, n, H, w, Dh) chunks -> (B, n, H, len(offsets) * w, Dh): each chunk's neighbours
    (chunk n + o for every offset o; missing chunks are zeros, masked by the plan)."""
    parts = []
    n = t.shape[1]
    for o in offsets:
        if o == 0:
            parts.append(t)
        elif o < 0:
            parts.append(F.pad(t, (0, 0, 0, 0, 0, 0, -o, 0))[:, :n])
        else:
            parts.append(F.pad(t, (0, 0, 0, 0, 0, 0, 0, o))[:, o:])
    return torch.cat(parts, dim=3)


def local_mask_mod(plan: LocalPlan, key_padding: Tensor | None = None):
    """The plan's pattern as a FlexAttention ``mask_mod``: query i sees key j when j's chunk is
    within ``look_backward`` / ``look_forward`` chunks of i's (and j <= i when causal) and j is a
    real token (``key_padding`` (B, T) bool, True = real)."""
    w, back, fwd = plan.window, -plan.offsets[0], plan.offsets[-1]

    def chunks(b, h, q_idx, kv_idx):
        d = kv_idx // w - q_idx // w
        return (d >= -back) & (d <= fwd)

    return masked_mod(chunks, causal=plan.causal, key_padding=key_padding)


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: LocalPlan,
    *,
    key_padding: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    strided: bool | None = None,
    relative: RelativeTables | None = None,
    flex: bool | None = None,
) -> Tensor:
    """Chunked attention over (B, T, H, Dh) queries, keys and values -> (B, T, H, Dh).

    ``key_padding``: (B, T) bool, True = real token. A query with no visible key (a padded query
    whose whole neighbourhood is padding) attends to itself alone.
    ``strided``: read each chunk's neighbours in place and keep only q, k, v, the output and the
    log-sum-exp for the backward (CPU, float32/64, no dropout, no key padding: see
    :func:`strided_unavailable`); ``False``: gather the neighbours into (chunks, K) tiles for
    SDPA (any device; the autograd graph keeps those tiles); ``None``: strided when it can.
    Both compute the same attention with the same kernel.
    ``relative``: add relative-position key and value embeddings over the token distance
    (:mod:`effiformer.attention.relative`, the Routing Transformer's local heads): the gathered
    path with materialised logits.
    ``flex``: through FlexAttention's block mask of the pattern (:func:`local_mask_mod`,
    :mod:`effiformer.ops.flex_patterns`); ``None``: on CUDA when there are no relative positions
    and no dropout (the device backend), never on the CPU (where FlexAttention has no backward;
    ``True`` runs it there for inference and tests). A query that sees no key gets zeros there.
    """
    if flex is None:  # the device backend: FlexAttention's block masks on CUDA
        flex = (
            q.device.type == "cuda" and relative is None and dropout_p == 0.0
            and flex_unavailable(q, needs_grad=torch.is_grad_enabled()) is None
        )  # fmt: skip
    if flex:
        if relative is not None or dropout_p > 0.0:
            raise ValueError("FlexAttention local attention takes neither relative positions nor "
                             "dropout")  # fmt: skip
        b, t, h, _ = q.shape
        bm = pattern_block_mask(
            local_mask_mod(plan, key_padding), None if key_padding is None else b, None, t, t,
            q.device,
        )  # fmt: skip
        qh, kh, vh = (z.transpose(1, 2) for z in (q, k, v))
        return flex_pattern_attention(qh, kh, vh, bm, scale=scale).transpose(1, 2)
    if relative is not None:
        if strided:
            raise ValueError("strided local attention cannot take relative positions")
        strided = False
    why = strided_unavailable(q, dropout_p=dropout_p, key_padding=key_padding)
    if strided and why is not None:
        raise ValueError(f"strided local attention cannot take this call: {why}")
    if strided is not False and why is None:
        return strided_local_attention(
            q, k, v, window=plan.window, back=-plan.offsets[0], fwd=plan.offsets[-1],
            causal=plan.causal, scale=scale,
        )  # fmt: skip
    b, t, h, dh = q.shape
    w, n, tp = plan.window, plan.n_chunks, plan.padded
    pad = tp - t

    def chunks(x: Tensor) -> Tensor:
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.view(b, n, w, h, dh).transpose(2, 3)  # (B, n, H, w, Dh)

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    kn, vn = _neighbours(kc, plan.offsets), _neighbours(vc, plan.offsets)  # (B, n, H, K, Dh)
    if key_padding is None and plan.regular_from is not None and relative is None:
        o = _regular_local(qc, kn, vn, plan, dropout_p, scale)  # (B, Tp, H, Dh)
        return o if pad == 0 else o[:, :t]
    keep = plan.keep[None, :, None]  # (1, n, 1, w, K)
    if key_padding is not None:
        kp = F.pad(key_padding.to(torch.bool), (0, pad)).view(b, n, 1, w)  # (B, n, 1, w)
        kp = _neighbours(kp[..., None], plan.offsets)[..., 0]  # (B, n, 1, K)
        keep = keep & kp[:, :, :, None, :]  # (B, n, 1, w, K)
    kk = kn.shape[3]
    keep4 = keep.expand(b, n, 1, w, kk).reshape(b * n, 1, w, kk)
    if key_padding is not None:
        # A query whose whole neighbourhood is padding (a padded query) attends to itself, so no
        # row is empty (an empty row would give NaN outputs and NaN gradients).
        empty = ~keep4.any(-1)  # (B*n, 1, w)
        if bool(empty.any()):
            own = plan.offsets.index(0) * w + torch.arange(w, device=q.device)  # (w,)
            diag = torch.zeros_like(keep4)
            diag[..., torch.arange(w, device=q.device), own] = True
            keep4 = keep4 | (diag & empty[..., None])
    qs, ks, vs = (
        qc.reshape(b * n, h, w, dh),
        kn.reshape(b * n, h, kk, dh),
        vn.reshape(b * n, h, kk, dh),
    )
    if relative is not None:
        # key slot s of a chunk's neighbourhood lies offsets[s // w] chunks away, at s % w in it:
        # its distance to query i of the chunk is the same in every chunk
        slot = torch.arange(kk, device=q.device)
        offs = torch.tensor(plan.offsets, device=q.device)[slot // w]
        index = relative.index(torch.arange(w, device=q.device), offs * w + slot % w)  # (w, K)
        o = relative_attention(
            qs, ks, vs, keep4, index, relative, scale=dh**-0.5 if scale is None else scale,
            dropout_p=dropout_p,
        )  # fmt: skip
    else:
        o = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=keep4, dropout_p=dropout_p, scale=scale
        )  # (B*n, H, w, Dh)
    o = o.view(b, n, h, w, dh).transpose(2, 3).reshape(b, tp, h, dh)  # (B, Tp, H, Dh)
    return o if pad == 0 else o[:, :t]


def _regular_local(
    qc: Tensor, kn: Tensor, vn: Tensor, plan: LocalPlan, dropout_p: float, scale: float | None
) -> Tensor:
    """``local_attention`` without key padding for a plan whose chunks from ``regular_from`` on
    share one mask: those chunks attend under one broadcast (1, 1, w, K) mask, the first ones
    under their own. Same result as one call under the (chunks, w, K) mask. -> (B, Tp, H, Dh)."""
    b, n, h, w, dh = qc.shape
    kk, r = kn.shape[3], plan.regular_from
    assert r is not None

    def attend(qs: Tensor, ks: Tensor, vs: Tensor, mask: Tensor) -> Tensor:
        m = qs.shape[1]
        o = F.scaled_dot_product_attention(
            qs.reshape(b * m, h, w, dh),
            ks.reshape(b * m, h, kk, dh),
            vs.reshape(b * m, h, kk, dh),
            attn_mask=mask,
            dropout_p=dropout_p,
            scale=scale,
        )  # (B*m, H, w, Dh)
        return o.view(b, m, h, w, dh)

    regular_mask = plan.keep[r][None, None]  # (1, 1, w, K), broadcast over every chunk
    if r:
        # split, not slices: the backward concatenates instead of zero-filling per slice
        (q0, q1), (k0, k1), (v0, v1) = (t.split([r, n - r], dim=1) for t in (qc, kn, vn))
        head_mask = plan.keep[:r][None].expand(b, r, w, kk).reshape(b * r, 1, w, kk)
        o = torch.cat([attend(q0, k0, v0, head_mask), attend(q1, k1, v1, regular_mask)], dim=1)
    else:
        o = attend(qc, kn, vn, regular_mask)  # (B, n, H, w, Dh)
    return o.transpose(2, 3).reshape(b, plan.padded, h, dh)


class LocalAttention(AttentionPart):
    """Multi-head local attention with Q, K, V, O projections (see the module docstring)."""

    def __init__(self, config: LocalConfig, dims: AttentionDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        d, inner = dims.dim, dims.inner_dim
        self.q_proj = nn.Linear(d, inner, bias=config.bias)
        self.k_proj = nn.Linear(d, inner, bias=config.bias)
        self.v_proj = nn.Linear(d, inner, bias=config.bias)
        self.o_proj = nn.Linear(inner, d, bias=config.bias)

    @property
    def look_forward(self) -> int:
        lf = self.config.look_forward
        return (0 if self.dims.causal else 1) if lf is None else lf

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> LocalPlan:
        if ctx.tq != ctx.tk:
            raise ValueError(
                f"local attention is self-attention over one sequence (Tq = Tk), got "
                f"Tq={ctx.tq}, Tk={ctx.tk}"
            )
        return make_plan(
            ctx.tk,
            self.config.window,
            self.config.look_backward,
            self.look_forward,
            causal=ctx.mask.causal,
            device=ctx.device,
        )

    @classmethod
    def example_config(cls, config: LocalConfig, seq_len: int) -> LocalConfig:
        return LocalConfig(window=max(1, seq_len // 4 - 3), bias=config.bias)  # 13 at T=64

    @classmethod
    def degenerate_config(cls, config: LocalConfig, seq_len: int) -> LocalConfig:
        return LocalConfig(window=seq_len, look_backward=0, look_forward=0, bias=config.bias)

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: LocalPlan | None = None,
    ) -> AttentionOutput:
        """x: (B, T, D) -> out (B, T, D); ``positions``: the :class:`LocalPlan` from prepare."""
        check_attention_inputs(x, kv, self.dims.dim, mask)
        if kv is not None or state is not None:
            raise ValueError("local attention takes neither kv nor state (self-attention only)")
        if mask is not None and mask.causal != self.dims.causal:
            raise ValueError(
                f"this local attention was built for causal={self.dims.causal}, got a mask with "
                f"causal={mask.causal}"
            )
        if not isinstance(positions, LocalPlan) or positions.padded < x.shape[1]:
            raise ValueError("local attention needs positions=LocalPlan from its prepare()")
        b, t, _ = x.shape
        h, dh = self.dims.n_heads, self.dims.head_dim
        q = self.q_proj(x).view(b, t, h, dh)  # (B, T, H, Dh)
        k = self.k_proj(x).view(b, t, h, dh)
        v = self.v_proj(x).view(b, t, h, dh)
        p = self.dims.dropout if self.training else 0.0
        o = local_attention(
            q, k, v, positions, key_padding=None if mask is None else mask.key_padding, dropout_p=p
        )
        return AttentionOutput(out=self.o_proj(o.reshape(b, t, h * dh)))


register_attention(
    "local",
    LocalConfig,
    LocalAttention,
    description="chunked local attention: own chunk and its neighbours (Reformer, Routing)",
)
