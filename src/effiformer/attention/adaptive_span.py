"""Adaptive Attention Span: every head learns how far back it looks.

Sukhbaatar, Grave, Bojanowski, Joulin 2019, "Adaptive Attention Span in Transformers" (ACL 2019),
arXiv 1905.07799. Official code: facebookresearch/adaptive-span (``adaptive_span.py``,
``models.py``), which this file follows where the paper leaves a choice open.

Implemented:

- **Sec. 2, the sequential Transformer's attention.** A query at position ``t`` attends to the
  ``S`` previous positions ``r = t-S ... t-1`` -- **not to itself** (the paper's sums run to
  ``t-1``; the official ``_skew``/``_unskew`` layout does the same: a query's ``L`` columns are
  the keys at distances ``L ... 1``). Scores are ``s_tr = q_t . (k_r + p_{t-r}) / sqrt(d_head)``
  with one learned position embedding ``key_pe`` of shape (1, d_head, S), random-normal
  initialised (std ``key_pe_std``, the official 1) and shared by every layer and every head (the
  official ``TransformerSeq.key_pe``):
  it lives in the group's shared module (:meth:`AdaptiveSpanAttention.build_shared`) and reaches
  the layers through ``prepare``. The projections have no biases (``MultiHeadSeqAttention``).
  ``include_self=True`` is an option (distances ``0 ... S-1``), off by default.
- **Sec. 3.1, the soft mask.** Per head, ``m_z(x) = clamp((R + z - x) / R, 0, 1)`` over the
  distance ``x = t - r``, ``z = p * S`` with ``p`` the learned ``current_val`` (one per head,
  initialised to ``init_span``, default 0: the initial span is about ``R``). The mask is applied
  *after* the softmax and each row is renormalised, divided by its sum + ``eps`` (1e-8), as the
  official ``AdaptiveSpan.forward``; this equals the paper's ``m exp(s) / sum(m exp(s))`` up to
  ``eps``. The ramp never masks a key with -inf (the trap: no gradient through the ramp): the
  softmax covers every key up to the ramp's end ``z + R`` (the end included, where the clamp
  still passes a gradient), and only keys beyond it, outside the window, padding and missing
  memory are excluded.
- **The span loss** ``(lambda / M) sum_i z_i = lambda * S * mean(p)`` per layer (``penalty`` is
  lambda), returned as ``AttentionOutput.aux["span_penalty"]`` in training only; the stack names
  it per layer (``ModelOutput.aux["blocks.3.span_penalty"]``), the trainer adds the layers up
  with the task loss, and evaluation (eval mode) reports the task loss alone.
- **p is clamped to [0, 1] after every optimiser step** (:meth:`after_optimizer_step`, called by
  :func:`effiformer.train.train` on every module).
- **Trimming** (official ``get_trim_len`` / ``trim_memory``): with ``reach = min(S, ceil(max z)
  + R)`` key slots (one more with ``include_self``) the window is ``W = S - floor_step(S -
  reach)`` keys (``trim_step`` = 64), so keys
  beyond the largest span plus the ramp are cut from the computation -- exactly, because their
  weight is exactly 0 -- and the keys' projections, scores and weights shrink with the spans.
  Within the window the queries are processed in chunks of ``C`` (a power-of-two multiple of
  ``trim_step``, or the whole segment), each against its own ``C + W - 1`` keys, the chunk size
  chosen per call to minimise ``T * (C + W - 1)``; with ``C = T`` this is the official layout's
  ``T * (T + W)`` cost, kept unless chunks save over 10% of it. The position term is laid out with the same skew as the official code.
- **The cache sized to the span** (``adapt_span_cache``, official ``get_cache_size``): in a model
  with a FIFO memory (the ``xl`` family with ``attention=adaptive_span``) each layer keeps
  ``min(mem_len, W + trim_step)`` detached past inputs (:meth:`memory_len`), the ``trim_step``
  slack letting the span grow before the next segment.

Deliberate deviations:

- The mask's distance is the paper's ``x = t - r``. The official mask template is one step
  further out (its ``x`` is ``t - r - 1``: with ``p = 0`` it gives ``R`` keys a non-zero weight
  where the paper's formula gives ``R - 1``), i.e. the code's span for a given ``p`` is the
  paper's plus one.
- In the ``xl`` family the memory starts empty (zero-length), as Transformer-XL does, where the
  official cache starts as zeros (zero keys and values that take softmax mass in the first
  segment); a memory shorter than the window (the official code pads it with zeros) likewise
  just has fewer keys.
- Queries are chunked (above) instead of one ``(T, T + W)`` skewed block per segment: the same
  weights and outputs (tested against :func:`adaptive_span_reference`, the full-matrix
  definition), less work when ``W`` is well below ``T``.
- The softmax covers the keys up to ``z + R`` of each head rather than the whole trimmed window
  (the official normaliser also counts the zero-weight keys between ``z + R`` and the window's
  end). After the renormalisation the two differ by O(eps) in the weights and gradients; ours
  does not depend on the window, so trimming changes nothing but rounding (tested), where the
  official's output moves by up to ~1e-6 relative when the window changes.
- ``degenerate_config`` sets ``eps = 0``: with the ramp inert the renormalisation is then
  exactly the identity and the part equals dense attention over the previous positions.

Not here: the persistent-memory ("all-attention") variant of the same code base. The paper's
Adagrad with per-parameter step clipping is ``effiformer.optim.AdagradParamClip``, the
``adaptive-span-*`` models' recipe (``effiformer.recipes.ADAPTIVE_SPAN_RECIPE``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
    keep_init,
)
from .registry import register_attention

__all__ = [
    "AdaptiveSpanConfig",
    "AdaptiveSpanAttention",
    "SpanShared",
    "SpanPositions",
    "adaptive_span_reference",
    "soft_mask",
]


@dataclass(frozen=True, kw_only=True)
class AdaptiveSpanConfig(AttentionConfig):
    """Adaptive attention span.

    ``max_span``: S, the longest span (keys at distances 1 ... S); ``ramp``: R, the width of the
    soft mask's ramp; ``init_span``: the initial p of every head (z = p S); ``penalty``: lambda of
    the span loss lambda S mean(p); ``trim_step``: granularity of the trimmed window and of the
    cache slack (the official 64); ``trim``: drop the keys beyond the largest span + R from the
    computation (off: always the full S window; the same result, for comparison);
    ``adapt_cache``: in a model with a FIFO memory, keep only the window + ``trim_step`` past
    states per layer; ``include_self``: the query also attends to its own position (distances
    0 ... S-1; off: the paper's and the official code's S previous positions); ``eps``: added to
    each row's sum before the renormalisation (the official 1e-8).
    """

    name = "adaptive_span"

    max_span: int = 1024
    ramp: int = 32
    init_span: float = 0.0
    penalty: float = 2e-6
    trim_step: int = 64
    trim: bool = True
    adapt_cache: bool = True
    include_self: bool = False
    eps: float = 1e-8
    key_pe_std: float = 1.0

    def __post_init__(self) -> None:
        self._check_positive("max_span")
        self._check_positive("ramp")
        self._check_positive("trim_step")
        for f in ("init_span", "penalty", "eps", "key_pe_std"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"attention.{f} must be a finite number, got {v!r}")
        if not 0.0 <= self.init_span <= 1.0:
            raise ConfigError(f"attention.init_span must be in [0, 1], got {self.init_span!r}")
        if self.penalty < 0:
            raise ConfigError(f"attention.penalty must be >= 0, got {self.penalty!r}")
        if self.eps < 0:
            raise ConfigError(f"attention.eps must be >= 0, got {self.eps!r}")
        if self.key_pe_std < 0:
            raise ConfigError(f"attention.key_pe_std must be >= 0, got {self.key_pe_std!r}")
        for f in ("trim", "adapt_cache", "include_self"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"attention.{f} must be a boolean, got {getattr(self, f)!r}")


class SpanShared(nn.Module):
    """What the layers of one model share: the position embedding ``key_pe`` (1, d_head, S),
    column ``S - 1 - u`` for the ``u``-th nearest key a query may see (the last column is the
    nearest), random-normal initialised (official ``TransformerSeq.key_pe``) with standard
    deviation ``std``."""

    def __init__(self, head_dim: int, max_span: int, std: float = 1.0) -> None:
        super().__init__()
        self.key_pe = keep_init(nn.Parameter(torch.randn(1, head_dim, max_span) * std))

    def make_dense_equivalent_(self) -> None:
        with torch.no_grad():
            self.key_pe.zero_()


@dataclass(frozen=True)
class SpanPositions:
    """Prepared once per forward for a group of layers: the shared ``key_pe`` (1, d_head, S)."""

    key_pe: Tensor


def soft_mask(distance: Tensor, z: Tensor, ramp: int) -> Tensor:
    """``m_z(x) = clamp((R + z - x) / R, 0, 1)``: distance (...) and z (H, 1, ..., 1) broadcast.
    Differentiable in ``z`` wherever ``0 <= R + z - x <= R``."""
    return ((ramp + z - distance) / ramp).clamp(0.0, 1.0)


def _floor_to(n: int, step: int) -> int:
    return (n // step) * step


def _skew(x: Tensor) -> Tensor:
    """(..., C, W) -> (..., C, C + W - 1): row ``a`` shifted right by ``a``, zeros elsewhere:
    ``out[..., a, a + j] = x[..., a, j]`` (the official ``_skew``)."""
    *lead, c, w = x.shape
    x = F.pad(x, (0, c))  # (..., C, W + C)
    x = x.reshape(*lead, c * (w + c))[..., : c * (w + c - 1)]  # drop the last row's padding
    return x.view(*lead, c, w + c - 1)


def _choose_chunk(tq: int, window: int, n_keys: int, step: int) -> int:
    """Query chunk size: the whole segment (one chunk, ``tq * n_keys`` scored pairs, no copies
    of the keys) unless some ``C = step * 2**k < tq`` scores over 10% fewer pairs
    (``ceil(tq / C) * C * (C + window - 1)``; its unfolded key and value windows are copies)."""
    whole = tq * n_keys
    best, best_cost = tq, whole
    c = step
    while c < tq:
        cost = -(-tq // c) * c * (c + window - 1)
        if cost < best_cost:
            best, best_cost = c, cost
        c *= 2
    return best if best_cost < 0.9 * whole else tq


class AdaptiveSpanAttention(AttentionPart):
    """Multi-head attention over the previous ``S`` positions with a learned soft span per head.

    forward(x (B, Tq, D), kv (B, Tk, D) = memory ++ x or None, mask causal) -> (B, Tq, D);
    queries are the last ``Tq`` of the ``Tk`` key positions. ``positions``: the
    :class:`SpanPositions` from :meth:`prepare`.
    """

    def __init__(self, config: AdaptiveSpanConfig, dims: AttentionDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        d, h, dh = dims.dim, dims.n_heads, dims.head_dim
        inner = h * dh
        self.q_proj = nn.Linear(d, inner, bias=False)
        self.k_proj = nn.Linear(d, inner, bias=False)
        self.v_proj = nn.Linear(d, inner, bias=False)
        self.o_proj = nn.Linear(inner, d, bias=False)
        # p of every head (official AdaptiveMask.current_val), clamped to [0, 1] after each step.
        self.current_val = keep_init(nn.Parameter(torch.full((h,), float(config.init_span))))
        self.dropout = dims.dropout

    @classmethod
    def from_config(cls, config: AdaptiveSpanConfig, dims: AttentionDims) -> AdaptiveSpanAttention:
        if not dims.causal:
            raise ConfigError("adaptive_span attends to previous positions: it needs causal=True")
        return cls(config, dims)

    @classmethod
    def build_shared(cls, config: AdaptiveSpanConfig, dims: AttentionDims) -> SpanShared:
        return SpanShared(dims.head_dim, config.max_span, config.key_pe_std)

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> SpanPositions:
        if not isinstance(shared, SpanShared):
            raise TypeError("adaptive_span's prepare needs the module from build_shared()")
        return SpanPositions(key_pe=shared.key_pe)

    # ---- the span ----------------------------------------------------------------------------

    @property
    def _offset(self) -> int:
        """Distance of the nearest key a query sees: 1 (previous positions) or 0 (itself)."""
        return 0 if self.config.include_self else 1

    def spans(self) -> Tensor:
        """z = p S per head, (H,), detached."""
        return self.current_val.detach() * self.config.max_span

    def reach(self) -> int:
        """Key slots the widest head's ramp reaches (distance <= z + R, with a slot of slack for
        rounding): ``min(S, ceil(max z) + R + 1 - offset)``, the official ``get_current_max_size``
        for the default layout."""
        c = self.config
        z = float(self.current_val.detach().max()) * c.max_span
        return max(1, min(c.max_span, math.ceil(z) + c.ramp + 1 - self._offset))

    def window(self) -> int:
        """The trimmed window: ``S - floor_step(S - reach)`` keys (>= 1), or S without trimming
        (official ``get_trim_len``)."""
        c = self.config
        if not c.trim:
            return c.max_span
        trim = _floor_to(min(c.max_span - 1, c.max_span - self.reach()), c.trim_step)
        return c.max_span - trim

    def memory_len(self, configured: int) -> int:
        """Past states a FIFO memory keeps for this layer: ``min(mem_len, window + trim_step)``
        with ``adapt_cache`` (official ``get_cache_size``), else ``mem_len``."""
        if not self.config.adapt_cache:
            return configured
        return min(configured, self.window() + self.config.trim_step)

    def span_penalty(self) -> Tensor:
        """``lambda * S * mean(p)``: the paper's ``(lambda / M) sum_i z_i`` for this layer."""
        c = self.config
        return c.penalty * c.max_span * self.current_val.mean()

    def own_clip_parameters(self) -> list[nn.Parameter]:
        """The span ratios p: their gradient through the soft mask is S / R times a weight's
        (the ramp's slope in units of p), so they are clipped apart from the rest, as the
        paper's per-parameter clipping (``AdagradParamClip``) keeps them."""
        return [self.current_val]

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Clamp p to [0, 1] (official ``clamp_param``, after every optimiser step)."""
        self.current_val.clamp_(0.0, 1.0)

    # ---- forward -----------------------------------------------------------------------------

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.dims.n_heads, self.dims.head_dim).transpose(1, 2)  # (B,H,T,Dh)

    def _check(self, x, kv, mask, state, positions) -> Tensor | None:
        check_attention_inputs(x, kv, self.dims.dim, mask)
        if state is not None:
            raise ValueError(
                "AdaptiveSpanAttention is stateless: pass the memory as kv=concat(memory, x), "
                "state=None"
            )
        if mask is not None and not mask.causal:
            raise ValueError("AdaptiveSpanAttention needs a causal mask (or mask=None)")
        if not isinstance(positions, SpanPositions):
            raise TypeError(
                "positions must be the SpanPositions from prepare(), got "
                f"{type(positions).__name__}"
            )
        pe = positions.key_pe
        want = (1, self.dims.head_dim, self.config.max_span)
        if tuple(pe.shape) != want:
            raise ValueError(f"positions.key_pe must be {want}, got {tuple(pe.shape)}")
        return None if mask is None else mask.key_padding

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: SpanPositions | None = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D); kv: (B, Tk, D) = memory ++ x, or None (= x) -> out (B, Tq, D); aux
        ``span_penalty`` in training."""
        key_padding = self._check(x, kv, mask, state, positions)
        src = x if kv is None else kv
        b, tq, _ = x.shape
        tk = src.shape[1]
        c, h, dh, off = self.config, self.dims.n_heads, self.dims.head_dim, self._offset
        # The last query (position tk - 1) reaches key 0 at slot tk - 1 - off: no wider window.
        w = min(self.window(), tk - off)
        aux = {"span_penalty": self.span_penalty()} if self.training and c.penalty > 0 else {}
        if w <= 0:  # one query and no earlier key: nothing to attend to
            zero = x.new_zeros(b, tq, h * dh)
            return AttentionOutput(out=self.o_proj(zero), aux=aux)
        mem = tk - tq
        # Keys some query can reach: query i (position mem + i) sees slots u = 0 .. w-1, i.e.
        # the keys at positions mem + i - off - u. Keys before lo or from hi on are never seen.
        lo = max(0, mem - off - w + 1)
        hi = tk - off
        q = self._heads(self.q_proj(x)) * dh**-0.5  # (B, H, Tq, Dh), scale folded in
        k = self._heads(self.k_proj(src[:, lo:hi]))  # (B, H, Nk, Dh)
        v = self._heads(self.v_proj(src[:, lo:hi]))  # (B, H, Nk, Dh)
        kp = None if key_padding is None else key_padding[:, lo:hi].to(torch.bool)  # (B, Nk)
        o = self._attend(q, k, v, kp, positions.key_pe, w, mem - lo)
        o = o.transpose(1, 2).reshape(b, tq, h * dh)  # (B, Tq, H*Dh)
        return AttentionOutput(out=self.o_proj(o), aux=aux)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding: Tensor | None,
        key_pe: Tensor,
        w: int,
        first: int,
    ) -> Tensor:
        """Chunked windowed attention. q (B, H, Tq, Dh) already scaled; k, v (B, H, Nk, Dh) the
        reachable keys, query 0 sitting at key index ``first`` (its own position); key_padding
        (B, Nk) or None; w the window (slots 0 .. w-1, distance = slot + offset) -> (B,H,Tq,Dh).

        Chunk j's queries (C of them) and its window of C + w - 1 keys: content scores over the
        window, then *unskewed* into slot coordinates (query a's column i is the key at window
        index a + i, slot w - 1 - i: the official layout, nearest key last), where the position
        term is a plain q . key_pe and the soft mask one (H, w) table per head; the weights are
        skewed back onto the window for the values.
        """
        c, off = self.config, self._offset
        b, h, tq, dh = q.shape
        n_keys = k.shape[2]
        chunk = _choose_chunk(tq, w, n_keys, c.trim_step)
        n = -(-tq // chunk)
        span = chunk + w - 1  # keys one chunk's queries reach
        # Left padding so that chunk j's window starts at padded key index j * chunk: query 0's
        # farthest slot w-1 is the key at index first - off - (w-1).
        pad_l = (w - 1 + off) - first
        pad_q = n * chunk - tq
        qc = F.pad(q, (0, 0, 0, pad_q)).view(b, h, n, chunk, dh)  # (B, H, n, C, Dh)
        if n == 1:  # one chunk: score the existing keys only, pad the scores instead
            col0 = pad_l
            kw, vw = k.unsqueeze(2), v.unsqueeze(2)  # (B, H, 1, Nk, Dh)
        else:
            col0 = 0
            pad_r = n * chunk + w - 1 - pad_l - n_keys
            kw = F.pad(k, (0, 0, pad_l, pad_r)).unfold(2, span, chunk).transpose(-1, -2)
            vw = F.pad(v, (0, 0, pad_l, pad_r)).unfold(2, span, chunk).transpose(-1, -2)
            # kw, vw: (B, H, n, C + w - 1, Dh)
        work = torch.promote_types(q.dtype, torch.float32)
        content = (qc @ kw.transpose(-1, -2)).to(work)  # (B, H, n, C, span - col0)
        if col0:
            content = F.pad(content, (col0, 0))  # (B, H, 1, C, span)
        # Unskew: column i of query a is window column a + i (flatten, pad C, view C x span+1).
        flat = F.pad(content.reshape(b, h, n, chunk * span), (0, chunk))
        scores = flat.view(b, h, n, chunk, span + 1)[..., :w]  # (B, H, n, C, w), slots w-1..0
        pe = key_pe[0, :, c.max_span - w :]  # (Dh, w): column i is slot w - 1 - i
        scores = scores + (qc @ pe).to(work)  # (B, H, n, C, w)
        dev = q.device
        dist = (torch.arange(w - 1, -1, -1, device=dev) + off).to(work)  # (w,) per column
        # Slots without a key: padded key index j * chunk + a + i outside the real keys, or
        # key padding.
        kidx = (
            torch.arange(n, device=dev)[:, None, None] * chunk
            + torch.arange(chunk, device=dev)[None, :, None]
            + torch.arange(w, device=dev)[None, None, :]
        )  # (n, C, w)
        missing = ((kidx < pad_l) | (kidx >= pad_l + n_keys))[None, None]  # (1, 1, n, C, w)
        if key_padding is not None:
            kp = F.pad(key_padding, (pad_l, n * chunk + w - 1 - pad_l - n_keys), value=False)
            missing = missing | ~kp[:, None, kidx]  # (B, 1, n, C, w)
        # The softmax runs over the keys the head's ramp reaches (distance <= z + R, the ramp's
        # end included so that the clamp passes its gradient): trimming never changes it.
        z = (self.current_val * c.max_span).to(work).view(h, 1, 1, 1)
        masked = missing | (dist > z.detach() + c.ramp)  # (B or 1, H, n, C, w)
        # A row with nothing to attend to (the first query of a segment without memory): the
        # most negative finite score keeps its softmax finite (and every other row's masked
        # weights exactly 0); its output is zeroed below.
        empty = masked.all(-1, keepdim=True)  # (B or 1, H, n, C, 1)
        scores = scores.masked_fill(masked, torch.finfo(work).min)
        probs = torch.softmax(scores, dim=-1)
        # The soft mask over distance, per head: after the softmax, then each row renormalised
        # (official AdaptiveSpan.forward).
        probs = probs * soft_mask(dist, z, c.ramp)  # (H, 1, 1, w) broadcast
        den = probs.sum(-1, keepdim=True) + c.eps
        if c.eps == 0:
            den = den.masked_fill(den == 0, 1.0)
        probs = probs * (~empty / den)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        probs = _skew(probs)[..., col0:]  # (B, H, n, C, span - col0) over the window's keys
        o = probs.to(vw.dtype) @ vw  # (B, H, n, C, Dh)
        return o.reshape(b, h, n * chunk, dh)[:, :, :tq]  # (B, H, Tq, Dh)

    # ---- the full-matrix definition (tests, inspection) --------------------------------------

    def attention_probs(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        positions: SpanPositions | None = None,
    ) -> Tensor:
        """The weights over all ``Tk`` keys, (B, H, Tq, Tk), from the full-matrix definition
        (no trimming, no chunks, before dropout): what :meth:`forward` computes."""
        key_padding = self._check(x, kv, mask, None, positions)
        src = x if kv is None else kv
        q = self._heads(self.q_proj(x))
        k = self._heads(self.k_proj(src))
        v = self._heads(self.v_proj(src))
        _, probs = adaptive_span_reference(
            q, k, v, positions.key_pe, self.current_val, self.config, key_padding=key_padding
        )
        return probs

    # ---- testing hooks -----------------------------------------------------------------------

    @classmethod
    def example_config(cls, config: AdaptiveSpanConfig, seq_len: int) -> AdaptiveSpanConfig:
        """S = 48 < 64 with spans z = 12, R = 8 and 8-key trimming: the window is 24 keys, the
        queries run in chunks of 8, and keys between z + R and S get exactly zero weight."""
        return AdaptiveSpanConfig(
            max_span=48, ramp=8, init_span=0.25, trim_step=8, penalty=config.penalty
        )

    @classmethod
    def degenerate_config(cls, config: AdaptiveSpanConfig, seq_len: int) -> AdaptiveSpanConfig:
        """Every head's span covers all of S >= seq_len (p = 1: the ramp starts beyond the last
        key, so every mask value is 1) and eps = 0: the renormalisation divides by exactly 1.
        With key_pe = 0 (:meth:`make_dense_equivalent_`) that is dense attention over the
        previous positions (:meth:`dense_reference`)."""
        return AdaptiveSpanConfig(
            max_span=max(seq_len, config.max_span),
            ramp=config.ramp,
            init_span=1.0,
            penalty=config.penalty,
            trim_step=config.trim_step,
            include_self=config.include_self,
            eps=0.0,
        )

    def make_dense_equivalent_(self) -> None:
        """p = 1 (the span covers everything); ``key_pe`` is zeroed by the shared module."""
        with torch.no_grad():
            self.current_val.fill_(1.0)

    def dense_reference(
        self, x: Tensor, *, kv: Tensor | None = None, mask: AttentionMask | None = None
    ) -> Tensor:
        """Dense softmax attention with this part's projections over what the layout lets a
        query see: the *previous* positions (its own too with ``include_self``), the keys of
        ``mask.key_padding``; a query with no such key outputs 0. (B, Tq, D)."""
        src = x if kv is None else kv
        b, tq, _ = x.shape
        tk = src.shape[1]
        q, k, v = (
            self._heads(self.q_proj(x)),
            self._heads(self.k_proj(src)),
            self._heads(self.v_proj(src)),
        )
        dist = (torch.arange(tq, device=x.device)[:, None] + tk - tq) - torch.arange(
            tk, device=x.device
        )[None, :]
        keep = (dist >= self._offset)[None, None]  # (1, 1, Tq, Tk)
        if mask is not None and mask.key_padding is not None:
            keep = keep & mask.key_padding[:, None, None, :].to(torch.bool)
        scores = (q @ k.transpose(-1, -2)) * self.dims.head_dim**-0.5
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without keys -> 0
        o = (probs @ v).transpose(1, 2).reshape(b, tq, -1)
        return self.o_proj(o)


def adaptive_span_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_pe: Tensor,
    p: Tensor,
    config: AdaptiveSpanConfig,
    *,
    key_padding: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The definition over the full (Tq, Tk) matrix: no trimming, no chunks, no skew.

    q (B, H, Tq, Dh) unscaled; k, v (B, H, Tk, Dh); key_pe (1, Dh, S); p (H,); queries are the
    last Tq key positions. Query i sees key j at distance ``d = i + Tk - Tq - j`` iff
    ``off <= d < S + off`` (off = 1, or 0 with ``include_self``) and the key is not padding; its
    score is ``q . (k_j + key_pe[:, S - 1 - (d - off)]) / sqrt(Dh)``; the softmax over those
    of them that the head's ramp reaches (``d <= z + R``) is multiplied by ``m_z(d)`` and each
    row divided by its sum + eps.
    Returns (out (B, H, Tq, Dh), probs (B, H, Tq, Tk)).
    """
    b, h, tq, dh = q.shape
    tk = k.shape[2]
    s, off = config.max_span, 0 if config.include_self else 1
    dist = (torch.arange(tq, device=q.device)[:, None] + tk - tq) - torch.arange(
        tk, device=q.device
    )[None, :]  # (Tq, Tk)
    slot = dist - off
    keep = (slot >= 0) & (slot < s)  # (Tq, Tk)
    pe = key_pe[0].flip(-1)  # (Dh, S): column u is slot u
    pos = (q @ pe).gather(-1, slot.clamp(0, s - 1).expand(b, h, tq, tk))  # (B, H, Tq, Tk)
    scores = (q @ k.transpose(-1, -2) + pos) * dh**-0.5
    keep = keep[None, None]
    if key_padding is not None:
        keep = keep & key_padding[:, None, None, :].to(torch.bool)
    z = (p * s).to(q.dtype).view(h, 1, 1)
    support = keep & (dist.to(q.dtype) <= z.detach() + config.ramp)  # (B or 1, H, Tq, Tk)
    empty = ~support.any(-1, keepdim=True)
    scores = scores.masked_fill(~(support | empty), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    m = soft_mask(dist.to(q.dtype), z, config.ramp)  # (H, Tq, Tk)
    probs = probs * (m * keep.to(q.dtype))
    den = probs.sum(-1, keepdim=True) + config.eps
    if config.eps == 0:
        den = den.masked_fill(den == 0, 1.0)
    probs = probs / den
    return probs @ v, probs


register_attention(
    "adaptive_span",
    AdaptiveSpanConfig,
    AdaptiveSpanAttention,
    modes=("causal",),
    description="learned soft span per head, trimmed computation (Sukhbaatar et al. 2019)",
)
