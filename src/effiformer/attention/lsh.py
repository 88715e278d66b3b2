"""Angular LSH attention with shared queries and keys: the Reformer's attention.

Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer", arXiv 2001.04451, sec. 2-3,
following the official trax code (``trax/layers/research/efficient_attention.py``,
``LSHSelfAttention``, ``hash_vecs``, ``attend``, ``mask_self_attention``).

Implemented, per head:

- **Shared QK** (sec. 2, "Shared-QK Transformer"): one projection gives the vectors ``q`` that are
  hashed and used as queries; the keys are ``q`` normalised to unit length. Exactly as trax's
  ``attend``: ``k = q / sqrt(mean(q^2) + 1e-6) / sqrt(Dh)`` (an RMS norm, then 1/sqrt(Dh), which
  makes ``|k| ~= 1``), and the logits are ``q . k`` with **no further 1/sqrt(Dh)**: the query's
  norm acts as a learned temperature. Values have their own projection; no biases (trax default).
- **Angular LSH** (sec. 2, eq. 3 of the paper; Andoni et al. 2015): per round ``r`` a Gaussian
  matrix ``R_r`` of shape (Dh, b/2); bucket = argmax([qR_r ; -qR_r]), ``b`` even. The default
  bucket count is trax's: ``b = 2 * max(1, L // chunk_len)`` (an average bucket is half a chunk),
  factorised above 128 into two even factors ``[b1, b2]`` (``b1 = 2**ceil(log2(sqrt(b)))``, bucket
  ``= h1 + b1 * h2``, the "hierarchical" hashing of ``hash_vecs``); ``n_buckets`` may give an even
  int or a tuple of even factors. Rotations are drawn in :meth:`LSHAttention.prepare` (once per
  model forward, from ``ctx.generator`` or the global RNG), so they are **resampled every forward
  pass**, and travel in ``positions``. No gradient flows through the hashing.
- **Sort** (sec. 2 "LSH attention"): each round's buckets are sorted stably by (bucket, position)
  -- trax's key ``L * bucket + position`` -- and the rounds are concatenated (round ``r`` fills
  slots ``r*L .. (r+1)*L - 1`` of the sorted stream), with the inverse permutation kept to unsort.
- **Chunks**: the sorted stream is cut into chunks of ``chunk_len``; each chunk attends to itself
  and ``n_chunks_before`` previous chunks (``n_chunks_after`` later ones), **circularly** across
  the whole stream as trax's ``look_adjacent`` (chunk 0 of round 0 sees the last chunk of the last
  round). As in current trax and HF, keys of other buckets inside a chunk are not masked.
- **Masks on original positions**, added to the logits as trax does (subtracted, never ``-inf``):
  causal (key position > query position) ``-1e9``, padding ``-1e9``, and the key at the query's own
  position ``-1e5``, so a token attends to itself only when nothing else is visible (the first
  token of a causal sequence). Padding tokens get a bucket of their own (the last, trax's extra
  bucket), so their content never moves real tokens in the sort.
- **Rounds combined** by their logsumexp weights (sec. 2 "Multi-round LSH attention"):
  ``o = sum_r exp(lse_r - logsumexp_r lse_r) o_r``. With ``duplicate_correction=True`` the paper's
  correction is applied: every logit of a pair (i, j) is lowered by ``log N_ij``, where ``N_ij``
  counts how many times key j appears in the windows of query i's copies over all rounds, so a
  key met in several rounds (or twice in one window) is counted once (the paper's eq. with
  ``m_ij = log N_ij``; trax's first enwik8 config, lucidrains' ``allow_duplicate_attention=False``;
  current trax and HF omit it: our default).

Cost: hashing O(L * Dh * b), the sort O(n_hashes * L log L), attention
O(n_hashes * L * (1 + before + after) * chunk_len * Dh); memory O(n_hashes * L * (Dh + chunk)) and
never a (L, L) tensor. The chunked attention is one custom autograd function
(``_LSHCore`` in :mod:`effiformer.ops.lsh_chunked`, the ops floor): the forward keeps only q,
k, v, the combined output and one logsumexp per sorted slot; the backward recomputes each block of chunks (flash-attention style), so the
(slots, window) logits are never stored for the backward pass. A round's gradient needs no
separate logsumexp path: with ``G_r = w_r * dO`` and the *combined* output ``o``,
``dS = P (dP - rowsum(G_r * o))`` already contains the gradient through the round weights.

Deviations / choices:

- Sequences that are not a multiple of ``chunk_len`` are padded at the end with padding tokens
  (their own bucket, masked); a sequence shorter than ``chunk_len`` uses one chunk of its own
  length. (trax requires ``L % chunk_len == 0``; HF silently runs full attention when
  ``L <= chunk_len``.)
- Rotations are drawn per layer and per head and shared across the batch (HF's choice); trax
  draws them per head and per example. A layer group's ``prepare`` is per layer
  (:meth:`LSHAttention.prepare_key` includes the layer index), so every layer has independent
  rotations.
- Attention dropout drops individual weights; trax broadcasts one (chunk, window) mask across
  chunks to save memory. Output dropout is the block's residual dropout.
- For reversible stacks the forward returns its buckets in ``AttentionOutput.replay``; passing
  that back as ``positions`` re-runs the layer on the same buckets (trax keeps them in the layer
  state, HF passes ``buckets``), so a reconstructed input that differs in the last bit cannot
  flip a hash.
- Changing a later token can change earlier *outputs* (its new hash moves it in the sort and so
  changes which earlier keys share a chunk); causality holds for the attention weights, which are
  exactly 0 on later positions (see ``tests/attention/test_lsh.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from ..ops.lsh_chunked import (
    CAUSAL_MASK_VALUE,
    SELF_MASK_VALUE,
    ChunkedLayout,
    chunked_attention,
    chunked_attention_weights,
    chunked_layout,
)
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
)
from .registry import register_attention

__all__ = [
    "LSHConfig",
    "LSHAttention",
    "LSHPlan",
    "default_bucket_factors",
    "hash_vectors",
    "sort_buckets",
    "lsh_attention",
    "lsh_attention_weights",
    "shared_qk_keys",
    "shared_qk_reference",
    "with_n_hashes",
    "CAUSAL_MASK_VALUE",
    "SELF_MASK_VALUE",
]


@dataclass(frozen=True, kw_only=True)
class LSHConfig(AttentionConfig):
    """``chunk_len``: chunk of the sorted stream; ``n_hashes``: hashing rounds (a runtime
    setting: it changes no weights, see :func:`with_n_hashes`); ``n_buckets``: buckets per round
    (an even int, a tuple of even factors, or ``None``: ``2 * L // chunk_len``, factorised above
    128, as trax); ``n_chunks_before`` / ``n_chunks_after``: neighbouring chunks each chunk
    attends to (circularly); ``duplicate_correction``: subtract ``log N_ij`` for keys met
    several times (the paper's correction); ``bias``: biases on the projections."""

    name = "lsh"

    chunk_len: int = 128
    n_hashes: int = 1
    n_buckets: int | tuple[int, ...] | None = None
    n_chunks_before: int = 1
    n_chunks_after: int = 0
    duplicate_correction: bool = False
    bias: bool = False

    def __post_init__(self) -> None:
        self._check_positive("chunk_len")
        self._check_positive("n_hashes")
        for name in ("n_chunks_before", "n_chunks_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"attention.{name} must be an integer >= 0, got {v!r}")
        nb = self.n_buckets
        if isinstance(nb, list):
            nb = tuple(nb)
            object.__setattr__(self, "n_buckets", nb)
        if nb is not None:
            factors = (nb,) if isinstance(nb, int) and not isinstance(nb, bool) else nb
            if (
                not isinstance(factors, tuple)
                or not factors
                or any(
                    isinstance(f, bool) or not isinstance(f, int) or f < 2 or f % 2 for f in factors
                )
            ):
                raise ConfigError(
                    "attention.n_buckets must be None, an even int >= 2 or a tuple of even ints "
                    f">= 2 (factorised buckets), got {self.n_buckets!r}"
                )
        if not isinstance(self.duplicate_correction, bool):
            raise ConfigError(
                f"attention.duplicate_correction must be a bool, got {self.duplicate_correction!r}"
            )


def default_bucket_factors(length: int, chunk_len: int) -> tuple[int, ...]:
    """trax's ``hash_vectors`` default: ``2 * max(1, length // chunk_len)`` buckets, factorised
    into ``(2**ceil(log2(sqrt(b))), 2 * (b // (2 * that)))`` when above 128."""
    n = 2 * max(1, length // chunk_len)
    if n <= 128:
        return (n,)
    div = 2 ** math.ceil(math.log2(math.sqrt(n)))
    return (div, 2 * (n // (2 * div)))


@dataclass(frozen=True)
class LSHPlan:
    """One layer's prepared inputs for one forward (see :meth:`LSHAttention.prepare`).

    length / chunk / padded: the sequence length T, the chunk length used (``min(chunk_len, T)``)
    and T rounded up to chunks; factors: bucket factors (their product is the bucket count, the
    padding bucket is one more); rotations: (H, Dh, n_hashes, sum(factors) // 2) float32;
    buckets: (B, H, n_hashes, padded) int, filled by a forward for its replay (``None`` in a
    prepared plan).
    """

    length: int
    chunk: int
    padded: int
    factors: tuple[int, ...]
    rotations: Tensor
    buckets: Tensor | None = None

    @property
    def n_buckets(self) -> int:
        return math.prod(self.factors)


def shared_qk_keys(q: Tensor, eps: float = 1e-6) -> Tensor:
    """trax ``attend``'s keys for shared QK: ``q`` RMS-normalised, then divided by sqrt(Dh)
    (unit length up to ``eps``). (..., Dh) -> (..., Dh)."""
    return q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) / math.sqrt(q.shape[-1])


@torch.no_grad()
def hash_vectors(q: Tensor, rotations: Tensor, factors: tuple[int, ...]) -> Tensor:
    """Angular LSH buckets: q (B, H, L, Dh), rotations (H, Dh, n_hashes, sum(factors) // 2) ->
    (B, H, n_hashes, L) long in ``[0, prod(factors))``: per factor ``f``,
    ``argmax([qR_f ; -qR_f])``, combined as ``h_1 + f_1 * h_2 + f_1 f_2 * h_3 ...``. One round
    at a time, and the argmax over ``[x; -x]`` without building it (ties resolve as argmax
    would: the first maximum)."""
    rotations = rotations.to(q.dtype)
    rounds = []
    for r in range(rotations.shape[2]):
        rot = torch.einsum("bhtd,hdk->bhtk", q, rotations[:, :, r])  # (B, H, L, rot/2)
        buckets, start, scale = None, 0, 1
        for f in factors:
            rv = rot[..., start : start + f // 2]
            start += f // 2
            hi, hi_at = rv.max(dim=-1)
            lo, lo_at = rv.min(dim=-1)
            h = torch.where(hi >= -lo, hi_at, lo_at + f // 2)  # (B, H, L)
            buckets = h if buckets is None else buckets + scale * h
            scale *= f
        rounds.append(buckets)
    return torch.stack(rounds, dim=2)


def sort_buckets(buckets: Tensor) -> tuple[Tensor, Tensor]:
    """Stable sort of each round by (bucket, position).

    buckets: (B, H, n_hashes, L) -> ``(positions, slots)``: ``positions`` (B, H, n_hashes * L):
    the original position at each slot of the sorted stream (round r fills slots
    ``r*L .. (r+1)*L - 1``); ``slots`` (B, H, n_hashes, L): the slot of (round r, position p),
    the inverse permutation (``positions.gather(-1, slots.flatten(2)) == p``).
    """
    b, h, n, t = buckets.shape
    pos = torch.arange(t, device=buckets.device)
    key = buckets.long() * t + pos  # (B, H, n_h, L): trax's L * bucket + position
    order = torch.argsort(key, dim=-1, stable=True)  # (B, H, n_h, L) positions in sorted order
    offsets = (torch.arange(n, device=buckets.device) * t)[:, None]  # (n_h, 1)
    slots = torch.empty_like(order)
    slots.scatter_(-1, order, pos.expand_as(order).contiguous())
    slots = slots + offsets  # (B, H, n_h, L) global slot of (r, p)
    return order.reshape(b, h, n * t), slots


def _check_core_args(q: Tensor, buckets: Tensor, chunk: int) -> None:
    b, h, t, _ = q.shape
    if t % chunk:
        raise ValueError(f"LSH attention needs L a multiple of chunk, got L={t}, chunk={chunk}")
    if buckets.dim() != 4 or buckets.shape[:2] != (b, h) or buckets.shape[-1] != t:
        raise ValueError(
            f"buckets must be (B={b}, H={h}, n_hashes, L={t}), got {tuple(buckets.shape)}"
        )


def _sorted_layout(q: Tensor, buckets: Tensor, chunk: int, **layout: Any) -> ChunkedLayout:
    """Check the call, sort the buckets (this mechanism's mathematics) and lay out the sorted
    stream for the ops floor's chunked kernel."""
    _check_core_args(q, buckets, chunk)
    positions, slots = sort_buckets(buckets)  # (B, H, n*L), (B, H, n, L)
    return chunked_layout(positions, slots, chunk, **layout)


def lsh_attention(
    q: Tensor,
    v: Tensor,
    buckets: Tensor,
    chunk: int,
    *,
    causal: bool,
    real: Tensor | None = None,
    n_chunks_before: int = 1,
    n_chunks_after: int = 0,
    duplicate_correction: bool = False,
    dropout_p: float = 0.0,
    impl: str = "auto",
) -> Tensor:
    """LSH attention over shared-QK vectors q (B, H, L, Dh) and values v (B, H, L, Dh) with
    buckets (B, H, n_hashes, L) -> (B, H, L, Dh) (a head-transposed view of (B, L, H, Dh)).
    ``L`` must be a multiple of ``chunk``; ``real``: (B, L) bool, False = padding (give padding
    the padding bucket). The sort is this mechanism's; the chunked attention is the ops floor's
    (:func:`effiformer.ops.lsh_chunked.chunked_attention`; ``impl`` as there)."""
    layout = _sorted_layout(
        q, buckets, chunk, causal=causal, real=real, n_chunks_before=n_chunks_before,
        n_chunks_after=n_chunks_after, duplicate_correction=duplicate_correction,
    )  # fmt: skip
    return chunked_attention(q, shared_qk_keys(q), v, layout, dropout_p=dropout_p, impl=impl)


def lsh_attention_weights(
    q: Tensor,
    buckets: Tensor,
    chunk: int,
    *,
    causal: bool,
    real: Tensor | None = None,
    n_chunks_before: int = 1,
    n_chunks_after: int = 0,
    duplicate_correction: bool = False,
) -> Tensor:
    """The (B, H, L, L) attention weights :func:`lsh_attention` applies (rounds combined, a key
    met several times summed), computed by the same blocks and masks. O(L^2): for tests and
    inspection only; the forward never builds it."""
    layout = _sorted_layout(
        q, buckets, chunk, causal=causal, real=real, n_chunks_before=n_chunks_before,
        n_chunks_after=n_chunks_after, duplicate_correction=duplicate_correction,
    )  # fmt: skip
    return chunked_attention_weights(q, shared_qk_keys(q), layout)


def shared_qk_reference(
    q: Tensor, v: Tensor, *, causal: bool, real: Tensor | None = None
) -> Tensor:
    """Full shared-QK attention with the LSH layer's logits and masks (unit keys, no 1/sqrt(Dh),
    ``-1e9`` for later and padded keys, ``-1e5`` for the query's own position): what LSH
    attention computes when one chunk covers the sequence. q, v (B, H, L, Dh) -> (B, H, L, Dh).
    Materialises (L, L) logits: the oracle for tests."""
    t = q.shape[2]
    s = q @ shared_qk_keys(q).transpose(-1, -2)  # (B, H, L, L)
    pos = torch.arange(t, device=q.device)
    s = s - (pos[None, :] == pos[:, None]).to(s.dtype) * SELF_MASK_VALUE
    if causal:
        s = s - (pos[None, :] > pos[:, None]).to(s.dtype) * CAUSAL_MASK_VALUE
    if real is not None:
        s = s - (~real)[:, None, None, :].to(s.dtype) * CAUSAL_MASK_VALUE
    return torch.softmax(s, dim=-1) @ v


# ------------------------------------------------------------------------------------- module


class LSHAttention(AttentionPart):
    """Multi-head shared-QK LSH self-attention (see the module docstring).

    Projections: ``qk_proj`` (shared queries/keys), ``v_proj``, ``o_proj``.
    """

    def __init__(self, config: LSHConfig, dims: AttentionDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        d, inner = dims.dim, dims.inner_dim
        self.qk_proj = nn.Linear(d, inner, bias=config.bias)
        self.v_proj = nn.Linear(d, inner, bias=config.bias)
        self.o_proj = nn.Linear(inner, d, bias=config.bias)

    def prepare_key(self):
        # One plan per layer: each layer draws its own rotations.
        return (type(self), self.config, self.dims.layer)

    def bucket_factors(self, padded: int) -> tuple[int, ...]:
        nb = self.config.n_buckets
        if nb is None:
            return default_bucket_factors(padded, self.config.chunk_len)
        return (nb,) if isinstance(nb, int) else tuple(nb)

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> LSHPlan:
        """Chunking for this forward's length and this layer's random rotations,
        (H, Dh, n_hashes, buckets/2) float32, drawn from ``ctx.generator`` (or the global RNG)."""
        if ctx.tq != ctx.tk:
            raise ValueError(
                f"LSH attention is self-attention over one sequence (Tq = Tk), got "
                f"Tq={ctx.tq}, Tk={ctx.tk}"
            )
        t = ctx.tk
        chunk = max(1, min(self.config.chunk_len, t))
        padded = -(-t // chunk) * chunk
        factors = self.bucket_factors(padded)
        shape = (self.dims.n_heads, self.dims.head_dim, self.config.n_hashes, sum(factors) // 2)
        g = ctx.generator
        device = g.device if g is not None else ctx.device
        rotations = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        return LSHPlan(t, chunk, padded, factors, rotations.to(ctx.device))

    @classmethod
    def example_config(cls, config: LSHConfig, seq_len: int) -> LSHConfig:
        return dataclasses.replace(config, chunk_len=max(1, seq_len // 8), n_hashes=2)

    @classmethod
    def degenerate_config(cls, config: LSHConfig, seq_len: int) -> LSHConfig:
        return dataclasses.replace(config, chunk_len=seq_len, n_buckets=None)

    @classmethod
    def causal_config(cls, config: LSHConfig, seq_len: int) -> None:
        return None  # causal in its weights only (see the module docstring)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.dims.n_heads, self.dims.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def dense_reference(
        self, x: Tensor, *, kv: Tensor | None = None, mask: AttentionMask | None = None
    ) -> Tensor:
        """Full shared-QK attention (:func:`shared_qk_reference`) with this layer's projections
        and masks: the degenerate limit (one chunk covering the sequence). (B, T, D)."""
        if kv is not None:
            raise ValueError("LSH attention is self-attention; kv must be None")
        b, t, _ = x.shape
        causal = self.dims.causal if mask is None else mask.causal
        real = None if mask is None or mask.key_padding is None else mask.key_padding.bool()
        o = shared_qk_reference(
            self._heads(self.qk_proj(x)), self._heads(self.v_proj(x)), causal=causal, real=real
        )
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: LSHPlan | None = None,
    ) -> AttentionOutput:
        """x: (B, T, D) -> out (B, T, D). ``positions``: the :class:`LSHPlan` from prepare, or a
        previous call's ``AttentionOutput.replay`` (same plan with its buckets) to re-run on the
        same buckets."""
        check_attention_inputs(x, kv, self.dims.dim, mask)
        if kv is not None or state is not None:
            raise ValueError("LSH attention takes neither kv nor state (self-attention only)")
        if mask is not None and mask.causal != self.dims.causal:
            raise ValueError(
                f"this LSH attention was built for causal={self.dims.causal}, got a mask with "
                f"causal={mask.causal}"
            )
        b, t, _ = x.shape
        if not isinstance(positions, LSHPlan) or positions.length != t:
            raise ValueError(
                f"LSH attention needs positions=LSHPlan from its prepare() for length {t}, got "
                f"{type(positions).__name__}"
                + (f" for length {positions.length}" if isinstance(positions, LSHPlan) else "")
            )
        plan = positions
        pad = plan.padded - t
        h, dh = self.dims.n_heads, self.dims.head_dim
        qk = self.qk_proj(x).view(b, t, h, dh)  # (B, T, H, Dh)
        v = self.v_proj(x).view(b, t, h, dh)
        kp = None if mask is None else mask.key_padding
        real = None
        if kp is not None or pad:
            real = torch.ones(b, t, dtype=torch.bool, device=x.device) if kp is None else kp.bool()
            real = F.pad(real, (0, pad), value=False)  # (B, Lp)
        if pad:
            qk = F.pad(qk, (0, 0, 0, 0, 0, pad))  # (B, Lp, H, Dh)
            v = F.pad(v, (0, 0, 0, 0, 0, pad))
        qk, v = qk.transpose(1, 2), v.transpose(1, 2)  # (B, H, Lp, Dh) views: no copies
        buckets = plan.buckets
        if buckets is None:
            buckets = hash_vectors(qk, plan.rotations, plan.factors)  # (B, H, n_h, Lp)
            if real is not None:
                buckets = buckets.masked_fill(~real[:, None, None, :], plan.n_buckets)
            buckets = buckets.to(torch.int32)
        elif buckets.shape != (b, self.dims.n_heads, self.config.n_hashes, plan.padded):
            raise ValueError(
                f"replayed buckets must be (B={b}, H={self.dims.n_heads}, n_hashes="
                f"{self.config.n_hashes}, {plan.padded}), got {tuple(buckets.shape)}"
            )
        p = self.dims.dropout if self.training else 0.0
        o = lsh_attention(
            qk,
            v,
            buckets,
            plan.chunk,
            causal=self.dims.causal,
            real=real,
            n_chunks_before=self.config.n_chunks_before,
            n_chunks_after=self.config.n_chunks_after,
            duplicate_correction=self.config.duplicate_correction,
            dropout_p=p,
        )  # (B, H, Lp, Dh)
        o = o[:, :, :t].transpose(1, 2).reshape(b, t, -1)  # (B, T, H*Dh)
        return AttentionOutput(
            out=self.o_proj(o), replay=dataclasses.replace(plan, buckets=buckets)
        )


def with_n_hashes(config: AttentionConfig, n_hashes: int) -> AttentionConfig:
    """``config`` with every LSH part's ``n_hashes`` set (inside layer patterns too); other
    mechanisms unchanged. ``n_hashes`` changes no weights, so a trained model rebuilt with it
    loads the same state dict."""
    if isinstance(config, LSHConfig):
        return dataclasses.replace(config, n_hashes=n_hashes)
    layers = getattr(config, "layers", None)
    if isinstance(layers, tuple) and all(isinstance(c, AttentionConfig) for c in layers):
        return dataclasses.replace(config, layers=tuple(with_n_hashes(c, n_hashes) for c in layers))
    return config


register_attention(
    "lsh",
    LSHConfig,
    LSHAttention,
    description="angular-LSH shared-QK attention over sorted chunks (Reformer, Kitaev et al. 2020)",
)
