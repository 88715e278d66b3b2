"""Routing attention: local heads beside content-routed heads clustered by online k-means.

Roy, Saffar, Vaswani, Grangier 2020/2021, "Efficient Content-Based Sparse Attention with Routing
Transformers", arXiv 2003.05997 (TACL 2021), sec. 4 (routing attention, online k-means), sec. 5
(the local/routing head mix) and the official code (google-research ``routing_transformer``:
``utils.py`` ``attention_nd``, ``clustered_local_attention_helper``, ``cluster_items``,
``online_kmeans``; the hyper-parameters of ``sparse_transformer.py``).

What one layer computes
-----------------------
The ``H`` heads of a layer are split into ``routing_heads`` routing heads (the first ones, as the
official code splits them) and ``H - routing_heads`` local heads; ``skip_first`` lower layers are
all local (:meth:`RoutingConfig.for_layer`, the official ``sparsity_skip_first``).

- **Local heads**: block-local attention, own block causally plus the previous block (official
  ``query_shape = memory_flange = 256``), i.e. :func:`~effiformer.attention.local.local_attention`
  with ``look_backward=1`` (``look_forward=1`` in a bidirectional model), SDPA scaling
  ``1/sqrt(d_head)``.
- **Routing heads**: queries (and keys) are normalised per head: ``qk_norm="layernorm"``, a
  LayerNorm without scale or bias as the official code (norm ``sqrt(d_head)``), or ``"l2"``, unit
  vectors as the paper writes it. Decoders share QK (``share_qk``, default: the model is causal):
  ``k := q`` for the routing heads only. Each head has ``K`` centroids ``mu`` (K, d_head);
  token ``t`` scores ``q_t . mu_c`` (dot product, not distance). **Balanced routing**: centroid
  ``c`` takes the ``w`` tokens with the highest scores over the whole segment, sorted by
  position; queries chosen by ``c`` attend to keys chosen by ``c`` under the causal mask *on
  original positions* (with unshared QK the official rank-based triangle would not be causal), by
  one SDPA call over (B * H_r, K, w, d_head) tiles with logits ``scale * q_hat . k_hat``. Outputs
  are scattered back; a token chosen by several centroids gets the mean of their outputs, a
  token chosen by none gets zero from the routing heads.
- **Online mini-batch k-means outside the optimiser**: :mod:`.routing_kmeans` (the statistics,
  the EMA of sums and counts, Laplace-smoothed centroids, the balanced top-``w`` routing, and how
  the update stays exact over micro-batches and DDP ranks). ``S`` and ``N`` are buffers
  (``ema_sums``, ``ema_counts``: saved in checkpoints, never seen by the optimiser); the centroids
  are computed from them on the fly (:meth:`RoutingAttention.centroids`). In training a forward
  returns the new ``S`` and ``N`` in ``AttentionOutput.updates`` (computed under ``no_grad``);
  the trainer averages them over micro-batches and DDP ranks and writes them after the optimiser
  step.
- **Commitment loss** ``commitment * mean ||x_hat - sg(mu_assigned)||^2`` (beta = 1e-4, official
  ``e_loss``) over the normalised queries plus the same over the keys, as the official code adds
  the two terms (under shared QK the keys are the queries, so the query term counts twice, as
  there), returned as
  ``aux["commitment"]`` in training: its gradient reaches q and k only (centroids are buffers and
  are detached anyway).

Deliberate deviations (each is a choice you can see in the code)
----------------------------------------------------------------
- Tokens chosen by several centroids are averaged exactly (``sum / count``); the official code
  divides by ``count + 0.01`` (which scales a token chosen once by 1/1.01), lucidrains by
  ``count + 1e-5``. With the exact mean the one-cluster limit *is* dense attention.
- Unshared QK (encoders): the official code runs the EMA twice per step on the same variables
  (queries, then keys); we use the paper's update (sec. 4.2, ``mu <- lambda mu + (1-lambda)/2
  sum Q + (1-lambda)/2 sum K``): the query and key statistics are averaged into one EMA step. The
  causal mask compares gathered positions (the trap of the rank-based triangle).
- Padding: padded tokens score ``-inf`` for every centroid (so they never displace real tokens),
  are masked as keys and excluded from the k-means statistics (as the official
  ``embedding_to_padding``) and from the commitment loss (the official mean includes them as
  constants).
- Relative positions (``max_relative_position``, off by default; the released configurations set
  513 as the official ``local_relative`` / ``sparsity_cluster_relative``): key and value tables
  shared by the heads of one type (:mod:`effiformer.attention.relative`), over the token distance
  in the local heads and the rank inside the position-sorted window in the routing heads, as
  there. They run on the gathered paths with materialised logits (no fused kernel).
  The official extra ``d_head x d_head`` projection shared by all heads before the output
  projection ("allow heads to talk") is omitted: it is linear and absorbed by ``o_proj``.
- Causality of the *selection*: as in the official training code, the top-``w`` competition runs
  over the whole segment, so a later token can displace an earlier one from a cluster. Attention
  weights on later positions are exactly zero, but an earlier output can change when later
  tokens change (the official decoder instead blanks future positions, so training and decoding
  differ; the lucidrains README reports the same). :meth:`RoutingAttention.causal_config` tells
  the contract test which configuration is exactly causal (one that selects every token).

Cost: scores O(T K d), selection O(T K), attention O(K w^2 d) = O(T w d) with ``K w ~ T``; the
k-means statistics O(T K d); no (T, T) tensor. ``clusters=None`` uses ``round(sqrt(seq_len))``
clusters (the paper's O(n^1.5 d) choice); ``cluster_window=None`` uses ``w = ceil(T / K)``; the
released configs fix both (enwik8 8k: 16 x 512).

Memory: q, k, v are read in place (views of the fused projection); local heads take
:func:`~effiformer.attention.local.local_attention`'s strided path, routing heads the routed
kernel :func:`effiformer.ops.routed.routed_flash_attention` where it applies (else SDPA over
gathered tiles; ``tests/attention/test_routing.py`` compares the paths with full references).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from ..ops.routed import gather_clusters, routed_flash_attention
from ..ops.strided_local import strided_unavailable
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
)
from .local import LocalPlan, local_attention, make_plan
from .registry import register_attention
from .relative import RelativeTables, relative_attention
from .routing_kmeans import (
    LN_EPS,
    QK_NORMS,
    centroids_from,
    ema_update,
    kmeans_statistics,
    normalize_qk,
    route,
)

__all__ = [  # the k-means functions live in .routing_kmeans and are re-exported here
    "LN_EPS",
    "QK_NORMS",
    "RoutingConfig",
    "RoutingAttention",
    "RoutingPlan",
    "normalize_qk",
    "route",
    "routed_attention",
    "kmeans_statistics",
    "ema_update",
    "centroids_from",
]


@dataclass(frozen=True, kw_only=True)
class RoutingConfig(AttentionConfig):
    """Routing attention (see the module docstring).

    routing_heads: heads routed by k-means (the first ones); ``None``: half of ``n_heads``; the
        rest are local heads. skip_first: the first layers are all local.
    window: local block length (own block causally plus the previous one).
    clusters: centroids per routing head (``None``: ``round(sqrt(seq_len))``).
    cluster_window: tokens each centroid takes, ``w`` (``None``: ``ceil(T / clusters)``; always
        at most ``T``).
    qk_norm: ``"layernorm"`` (official: LayerNorm without scale or bias) or ``"l2"`` (paper).
    share_qk: routing keys are the queries (``None``: when the model is causal).
    scale: routing logits are ``scale * q_hat . k_hat`` (``None``: the official logits: 1 on
        LayerNorm'd vectors, whose norm is sqrt(d_head), so the logits are d_head times the
        cosine; ``d_head`` on unit ``"l2"`` vectors, the same logits: scale 1 there would leave
        cosines in [-1, 1] and a near-uniform attention).
    decay / epsilon / commitment: k-means EMA decay, Laplace smoothing, commitment weight beta.
    bias: biases on the Q, K, V, O projections (the official projections have none).
    max_relative_position: relative-position key and value embeddings in both head types
        (:mod:`effiformer.attention.relative`; official ``local_relative`` and
        ``sparsity_cluster_relative`` with ``max_relative_position``, 513 in the released
        models): the token distance in the local heads, the rank inside the cluster's
        position-sorted window in the routing heads, clipped to +-M; ``None``: none.
    mute_routed: an ablation, not part of the method: the routed heads' output is zeroed before
        the output projection (their k-means still runs), so the model has its local heads and
        nothing from the routed ones at the same parameter count: does a routed head help, fail
        to help, or harm? (``False``: the method.)
    """

    name = "routing"

    routing_heads: int | None = None
    skip_first: int = 0
    window: int = 256
    clusters: int | None = None
    cluster_window: int | None = None
    qk_norm: str = "layernorm"
    share_qk: bool | None = None
    scale: float | None = None
    decay: float = 0.999
    epsilon: float = 1e-5
    commitment: float = 1e-4
    bias: bool = False
    max_relative_position: int | None = None
    mute_routed: bool = False

    def __post_init__(self) -> None:
        self._check_positive("window")
        if not isinstance(self.mute_routed, bool):
            raise ConfigError(
                f"attention.mute_routed must be true or false, got {self.mute_routed!r}"
            )
        if self.max_relative_position is not None:
            self._check_positive("max_relative_position")
        for name in ("routing_heads", "skip_first"):
            v = getattr(self, name)
            if v is None and name == "routing_heads":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"attention.{name} must be an integer >= 0, got {v!r}")
        for name in ("clusters", "cluster_window"):
            if getattr(self, name) is not None:
                self._check_positive(name)
        self._check_choice("qk_norm", QK_NORMS)
        if self.share_qk is not None and not isinstance(self.share_qk, bool):
            raise ConfigError(
                f"attention.share_qk must be true, false or None, got {self.share_qk!r}"
            )
        if self.scale is not None and not (isinstance(self.scale, (int, float)) and self.scale > 0):
            raise ConfigError(
                f"attention.scale must be a positive number or None, got {self.scale!r}"
            )
        if not (isinstance(self.decay, (int, float)) and 0.0 <= self.decay < 1.0):
            raise ConfigError(f"attention.decay must be in [0, 1), got {self.decay!r}")
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon > 0):
            raise ConfigError(f"attention.epsilon must be > 0, got {self.epsilon!r}")
        if not (isinstance(self.commitment, (int, float)) and self.commitment >= 0):
            raise ConfigError(f"attention.commitment must be >= 0, got {self.commitment!r}")

    def for_layer(self, layer: int, n_layers: int) -> RoutingConfig:
        """Layers below ``skip_first`` turn their routing heads into local heads."""
        if layer < self.skip_first and self.routing_heads != 0:
            return dataclasses.replace(self, routing_heads=0)
        return self


@dataclass(frozen=True)
class RoutingPlan:
    """What one forward's routing layers share (built in ``prepare``): the local heads' block plan
    (``None`` without local heads) and the mask's causality."""

    local: LocalPlan | None
    causal: bool


# ------------------------------------------------------------------------------------ functions


def routed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_idx: Tensor,
    k_idx: Tensor,
    *,
    causal: bool,
    real: Tensor | None = None,
    scale: float = 1.0,
    dropout_p: float = 0.0,
    strided: bool | None = None,
    relative: RelativeTables | None = None,
) -> Tensor:
    """Attention within clusters, scattered back to positions.

    q, k, v: (B, H, T, Dh) (q, k already normalised); q_idx / k_idx: (B, H, K, w) sorted token
    indices of each cluster's queries and keys (the same tensor under shared QK); real: (B, T)
    key padding (True = real). Query ``i`` of cluster ``c`` attends to the keys of cluster ``c``
    at positions ``<= i`` (causal) that are real. Returns (B, H, T, Dh): each token's mean over
    the clusters that chose it as a query (and gave it at least one key), zero for the others.

    ``strided``: gather the clusters group by group inside one autograd node that keeps q, k, v
    (the caller's tensors), the indices, the per-cluster outputs and log-sum-exp only, and
    gathers again in the backward (CPU, float32/64, no dropout, no key padding, and under the
    causal mask shared indices: :func:`strided_unavailable`); ``False``: gather once and let
    autograd keep the gathered tiles; ``None``: strided when it can. Same kernel, same result.
    ``relative``: relative key and value embeddings over the rank difference inside each
    cluster's position-sorted window (the official ``sparsity_cluster_relative``); the gathered
    path with materialised logits.
    """
    b, h, t, dh = v.shape
    kk, w = q_idx.shape[2], q_idx.shape[3]
    shared = q_idx is k_idx or torch.equal(q_idx, k_idx)
    if relative is not None:
        if strided:
            raise ValueError("strided routed attention cannot take relative positions")
        strided = False
    why = strided_unavailable(q, dropout_p=dropout_p, key_padding=real)
    if why is None and causal and not shared:
        why = "unshared indices need the positional causal mask (the gathered path builds it)"
    if strided and why is not None:
        raise ValueError(f"strided routed attention cannot take this call: {why}")
    if strided is not False and why is None:
        return routed_flash_attention(q, k, v, q_idx, k_idx, causal=causal, scale=scale)
    qg = gather_clusters(q, q_idx).view(b * h, kk, w, dh)  # (B*H, K, w, Dh)
    kg = qg if (shared and k is q) else gather_clusters(k, k_idx).view(b * h, kk, w, dh)
    vg = gather_clusters(v, k_idx).view(b * h, kk, w, dh)
    keep = None
    has_key = None
    if relative is not None and causal and shared and real is None:
        # the rank triangle (sorted, distinct positions), explicit for the manual kernel
        keep = torch.ones(w, w, dtype=torch.bool, device=q.device).tril()
        ranks = torch.arange(w, device=q.device)
        o = relative_attention(
            qg, kg, vg, keep, relative.index(ranks, ranks), relative, scale=scale,
            dropout_p=dropout_p,
        )  # fmt: skip
    elif causal and shared and real is None:
        # Sorted, distinct positions: the rank triangle is the positional causal mask.
        o = F.scaled_dot_product_attention(
            qg, kg, vg, is_causal=True, scale=scale, dropout_p=dropout_p
        )
    else:
        if causal:
            keep = k_idx[..., None, :] <= q_idx[..., :, None]  # (B, H, K, w, w)
        if real is not None:
            rk = real[:, None, :].expand(b, h, t).gather(2, k_idx.reshape(b, h, kk * w))
            rk = rk.view(b, h, kk, 1, w)  # (B, H, K, 1, w)
            keep = rk if keep is None else keep & rk
        if keep is not None:
            keep = keep.expand(b, h, kk, w, w)
            has_key = keep.any(-1)  # (B, H, K, w)
            if not bool(has_key.all()):
                # A row with no visible key would be NaN: let it see key 0 and zero it below.
                first = torch.zeros_like(keep)
                first[..., 0] = True
                keep = keep | (first & ~has_key[..., None])
            keep = keep.reshape(b * h, kk, w, w)
        if relative is not None:
            ranks = torch.arange(w, device=q.device)
            o = relative_attention(
                qg, kg, vg, keep, relative.index(ranks, ranks), relative, scale=scale,
                dropout_p=dropout_p,
            )  # fmt: skip
        else:
            o = F.scaled_dot_product_attention(
                qg, kg, vg, attn_mask=keep, scale=scale, dropout_p=dropout_p
            )  # (B*H, K, w, Dh)
    o = o.view(b, h, kk * w, dh)
    flat = q_idx.reshape(b, h, kk * w)
    if has_key is None:
        weight = torch.ones(b, h, kk * w, dtype=o.dtype, device=o.device)
    else:
        weight = has_key.reshape(b, h, kk * w).to(o.dtype)
        o = o * weight[..., None]
    out = o.new_zeros(b, h, t, dh).scatter_add(2, flat[..., None].expand(b, h, kk * w, dh), o)
    count = o.new_zeros(b, h, t).scatter_add(2, flat, weight)  # (B, H, T)
    return out / count.clamp_min(1.0)[..., None]


# ------------------------------------------------------------------------------------ the part


class RoutingAttention(AttentionPart):
    """Local heads plus routing heads with online k-means centroids (see the module docstring).

    Parameters: ``q_proj`` (all heads), ``k_proj`` (local heads, plus routing heads when QK is
    not shared; absent when no head needs its own keys), ``v_proj``, ``o_proj``. Buffers (routing
    heads only): ``ema_sums`` (H_r, K, Dh), ``ema_counts`` (H_r, K).
    """

    def __init__(self, config: RoutingConfig, dims: AttentionDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        h, dh, d = dims.n_heads, dims.head_dim, dims.dim
        hr = h // 2 if config.routing_heads is None else config.routing_heads
        if hr > h:
            raise ConfigError(f"attention.routing_heads={hr} exceeds the model's n_heads={h}")
        self.n_routing, self.n_local = hr, h - hr
        self.share_qk = dims.causal if config.share_qk is None else config.share_qk
        self.q_proj = nn.Linear(d, h * dh, bias=config.bias)
        n_keys = self.n_local + (0 if self.share_qk else hr)
        self.k_proj = nn.Linear(d, n_keys * dh, bias=config.bias) if n_keys else None
        self.v_proj = nn.Linear(d, h * dh, bias=config.bias)
        self.o_proj = nn.Linear(h * dh, d, bias=config.bias)
        m = config.max_relative_position
        # one pair of tables per head type, shared by its heads (the official variable scopes)
        self.rel_routing = RelativeTables(m, dh) if m and hr else None
        self.rel_local = RelativeTables(m, dh) if m and self.n_local else None
        self.n_clusters = 0
        if hr:
            if config.clusters is not None:
                k = config.clusters
            elif dims.max_len is not None:
                k = max(1, round(math.sqrt(dims.max_len)))
            else:
                raise ConfigError(
                    "attention.clusters=None derives the clusters from the model's seq_len, "
                    "which these dims do not give; set attention.clusters"
                )
            self.n_clusters = k
            init = normalize_qk(torch.randn(hr, k, dh), config.qk_norm)
            self.register_buffer("ema_sums", init)  # (H_r, K, Dh)
            self.register_buffer("ema_counts", torch.zeros(hr, k))  # (H_r, K)

    # ---- k-means state ------------------------------------------------------------------

    def centroids(self) -> Tensor:
        """(H_r, K, Dh): ``ema_sums / smoothed(ema_counts)`` (see :func:`centroids_from`)."""
        if not self.n_routing:
            raise ValueError("this layer has no routing heads (and no centroids)")
        return centroids_from(self.ema_sums, self.ema_counts, self.config.epsilon)

    @property
    def scale(self) -> float:
        if self.config.scale is not None:
            return float(self.config.scale)
        return float(self.dims.head_dim) if self.config.qk_norm == "l2" else 1.0

    def cluster_window(self, t: int) -> int:
        w = self.config.cluster_window
        if w is None:
            w = -(-t // self.n_clusters)
        return max(1, min(w, t))

    # ---- interface ----------------------------------------------------------------------

    @property
    def look_forward(self) -> int:
        return 0 if self.dims.causal else 1

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> RoutingPlan:
        if ctx.tq != ctx.tk:
            raise ValueError(
                f"routing attention is self-attention over one sequence (Tq = Tk), got "
                f"Tq={ctx.tq}, Tk={ctx.tk}"
            )
        local = None
        if self.n_local:
            local = make_plan(
                ctx.tk,
                self.config.window,
                1,
                self.look_forward,
                causal=ctx.mask.causal,
                device=ctx.device,
            )
        return RoutingPlan(local=local, causal=ctx.mask.causal)

    @classmethod
    def example_config(cls, config: RoutingConfig, seq_len: int) -> RoutingConfig:
        # At T=64: local blocks of 13, 4 clusters of 12 tokens (48 slots: some tokens are chosen
        # by no centroid, some by several).
        return dataclasses.replace(
            config, window=max(1, seq_len // 4 - 3), clusters=4, cluster_window=max(1, seq_len // 5)
        )

    @classmethod
    def degenerate_config(cls, config: RoutingConfig, seq_len: int) -> RoutingConfig:
        # One block covering the sequence, one cluster taking every token: local heads are dense
        # attention, routing heads dense attention on normalised (shared) queries and keys.
        return dataclasses.replace(config, window=seq_len, clusters=1, cluster_window=seq_len)

    @classmethod
    def causal_config(cls, config: RoutingConfig, seq_len: int) -> RoutingConfig:
        # The top-w selection competes over the whole segment (official training code), so only a
        # selection that takes every token is exactly causal; masks are tested separately.
        return dataclasses.replace(config, cluster_window=seq_len)

    def dense_reference(
        self, x: Tensor, *, kv: Tensor | None = None, mask: AttentionMask | None = None
    ) -> Tensor:
        """What the degenerate configuration equals, with full (T, T) tensors: dense attention
        in the local heads; in the routing heads dense attention with logits
        ``scale * q_hat . k_hat`` on the normalised queries and keys (``k_hat = q_hat`` under
        shared QK). (B, T, D)."""
        if kv is not None:
            raise ValueError("routing attention is self-attention; kv must be None")
        b, t, _ = x.shape
        h, dh, hr = self.dims.n_heads, self.dims.head_dim, self.n_routing
        q = self.q_proj(x).view(b, t, h, dh).transpose(1, 2)  # (B, H, T, Dh)
        v = self.v_proj(x).view(b, t, h, dh).transpose(1, 2)
        k = None if self.k_proj is None else self.k_proj(x).view(b, t, -1, dh).transpose(1, 2)
        keep = None if mask is None else mask.to_bool(t, t, device=x.device)
        pos = torch.arange(t, device=x.device)
        outs = []
        if hr:
            qn = normalize_qk(q[:, :hr], self.config.qk_norm)
            kn = qn if self.share_qk else normalize_qk(k[:, :hr], self.config.qk_norm)
            if self.rel_routing is not None:  # one cluster of every token: rank = position
                outs.append(relative_attention(
                    qn, kn, v[:, :hr], keep, self.rel_routing.index(pos, pos), self.rel_routing,
                    scale=self.scale,
                ))  # fmt: skip
            else:
                s = self.scale * qn @ kn.transpose(-1, -2)  # (B, H_r, T, T)
                if keep is not None:
                    s = s.masked_fill(~keep, float("-inf"))
                outs.append(torch.softmax(s, -1) @ v[:, :hr])
        if self.n_local:
            kl = k[:, k.shape[1] - self.n_local :]
            if self.rel_local is not None:
                outs.append(relative_attention(
                    q[:, hr:], kl, v[:, hr:], keep, self.rel_local.index(pos, pos),
                    self.rel_local, scale=1 / math.sqrt(dh),
                ))  # fmt: skip
            else:
                s = q[:, hr:] @ kl.transpose(-1, -2) / math.sqrt(dh)
                if keep is not None:
                    s = s.masked_fill(~keep, float("-inf"))
                outs.append(torch.softmax(s, -1) @ v[:, hr:])
        o = torch.cat(outs, dim=1).transpose(1, 2).reshape(b, t, h * dh)
        return self.o_proj(o)

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: RoutingPlan | None = None,
    ) -> AttentionOutput:
        """x: (B, T, D) -> out (B, T, D); ``positions``: the :class:`RoutingPlan` from prepare.
        In training: ``aux["commitment"]`` and ``updates`` ``{"ema_sums", "ema_counts"}``."""
        check_attention_inputs(x, kv, self.dims.dim, mask)
        if kv is not None or state is not None:
            raise ValueError("routing attention takes neither kv nor state (self-attention only)")
        if mask is not None and mask.causal != self.dims.causal:
            raise ValueError(
                f"this routing attention was built for causal={self.dims.causal}, got a mask "
                f"with causal={mask.causal}"
            )
        if not isinstance(positions, RoutingPlan) or (
            positions.local is not None and positions.local.padded < x.shape[1]
        ):
            raise ValueError("routing attention needs positions=RoutingPlan from its prepare()")
        b, t, _ = x.shape
        h, dh, hr = self.dims.n_heads, self.dims.head_dim, self.n_routing
        real = None if mask is None else mask.key_padding
        p = self.dims.dropout if self.training else 0.0
        q_r, q_l, k_r, k_l, v_r, v_l = self._qkv(x)  # (B, T, H_part, Dh) views, k_r None if shared
        aux: dict[str, Tensor] = {}
        updates: dict[str, Tensor] = {}
        outs: list[Tensor] = []
        if hr:
            o, aux, updates = self._routing(q_r, k_r, v_r, real, positions, p)  # (B, H_r, T, Dh)
            if self.config.mute_routed:  # the ablation: nothing from the routed heads
                o = torch.zeros_like(o)
            outs.append(o.transpose(1, 2))  # (B, T, H_r, Dh)
        if self.n_local:
            # the local heads read q, k, v in place (views of the projection: no copies)
            o = local_attention(
                q_l, k_l, v_l, positions.local, key_padding=real, dropout_p=p,
                relative=self.rel_local,
            )  # fmt: skip
            outs.append(o)  # (B, T, H_l, Dh)
        del o
        o = torch.cat(outs, dim=2).reshape(b, t, h * dh)  # (B, T, H*Dh)
        del outs  # the routing output is not needed beyond the concatenation
        return AttentionOutput(out=self.o_proj(o), aux=aux, updates=updates)

    def _qkv(self, x: Tensor) -> list[Tensor | None]:
        """The Q, K, V projections of x (B, T, D) as one matmul over the stacked weights (one
        pass over x forward and backward instead of three), cut by one split into the routing
        and local heads' parts ``q_r, q_l, k_r, k_l, v_r, v_l`` (B, T, H_part, Dh): the backward
        concatenates their gradients once. ``k_r`` is None under shared QK; ``k_l`` without
        local heads when no head has its own keys."""
        b, t, _ = x.shape
        dh, hr, hl = self.dims.head_dim, self.n_routing, self.n_local
        projs = [p for p in (self.q_proj, self.k_proj, self.v_proj) if p is not None]
        weight = torch.cat([p.weight for p in projs])
        bias = None if projs[0].bias is None else torch.cat([p.bias for p in projs])
        heads = [hr, hl]
        if self.k_proj is not None:  # rows: routing heads' keys (unshared only), local heads'
            heads += [0 if self.share_qk else hr, hl]
        heads += [hr, hl]
        parts = F.linear(x, weight, bias).split([n * dh for n in heads], dim=-1)
        out: list[Tensor | None] = [
            p.view(b, t, n, dh) for p, n in zip(parts, heads, strict=True)
        ]  # (B, T, H_part, Dh)
        if self.k_proj is None:
            out[2:2] = [None, None]
        if self.share_qk:
            out[2] = None
        return out

    def _routing(self, q, k, v, real, plan: RoutingPlan, dropout_p: float):
        """q, k (or None: shared), v: (B, T, H_r, Dh) -> out (B, H_r, T, Dh), aux, updates."""
        cfg = self.config
        t = q.shape[1]
        qn = normalize_qk(q, cfg.qk_norm).transpose(1, 2)  # (B, H_r, T, Dh)
        kn = qn if k is None else normalize_qk(k, cfg.qk_norm).transpose(1, 2)
        v = v.transpose(1, 2)  # (B, H_r, T, Dh), a view
        mu = self.centroids().to(qn.dtype)  # (H_r, K, Dh)
        w = self.cluster_window(t)
        with torch.no_grad():
            q_scores = qn @ mu.transpose(-1, -2)  # (B, H_r, T, K)
            q_idx = route(q_scores.transpose(-1, -2), w, real)  # (B, H_r, K, w)
            if k is None:
                k_scores, k_idx = q_scores, q_idx
            else:
                k_scores = kn @ mu.transpose(-1, -2)
                k_idx = route(k_scores.transpose(-1, -2), w, real)
        out = routed_attention(
            qn, kn, v, q_idx, k_idx, causal=plan.causal, real=real, scale=self.scale,
            dropout_p=dropout_p, relative=self.rel_routing,
        )  # fmt: skip
        if not self.training:
            return out, {}, {}
        weight = None if real is None else real.to(qn.dtype)
        counts, sums, assign = kmeans_statistics(qn, mu, weight, scores=q_scores)
        loss = self._commitment(qn, mu, assign, weight)
        if k is None:  # shared QK: the official key term is the query term again
            loss = 2 * loss
        else:
            k_counts, k_sums, k_assign = kmeans_statistics(kn, mu, weight, scores=k_scores)
            counts, sums = (counts + k_counts) / 2, (sums + k_sums) / 2
            loss = loss + self._commitment(kn, mu, k_assign, weight)
        with torch.no_grad():
            new_sums, new_counts = ema_update(
                self.ema_sums, self.ema_counts, sums, counts, cfg.decay
            )
        aux = {"commitment": cfg.commitment * loss}
        return out, aux, {"ema_sums": new_sums, "ema_counts": new_counts}

    @staticmethod
    def _commitment(x: Tensor, mu: Tensor, assign: Tensor, weight: Tensor | None) -> Tensor:
        """mean over real tokens and channels of (x - sg(mu[assign]))^2; x (B, H, T, Dh)."""
        b, h, t, dh = x.shape
        target = (
            mu.detach()[None].expand(b, h, -1, dh).gather(2, assign[..., None].expand(b, h, t, dh))
        )  # (B, H, T, Dh)
        if weight is None:
            return F.mse_loss(x, target)
        sq = (x - target).pow(2) * weight[:, None, :, None]
        return sq.sum() / (weight.sum() * h * dh).clamp_min(1.0)


register_attention(
    "routing",
    RoutingConfig,
    RoutingAttention,
    description="local heads + k-means routed heads with balanced clusters (Roy et al. 2020)",
)
