"""The ``routing-transformer`` reference row for ``effiformer bench``: lucidrains' public PyTorch
Routing Transformer (package ``routing-transformer``, the ``bench`` extra) at the shape of a
routing config, beside ``--part attention`` of our ``routing-*`` models.

The workload is one ``routing_transformer.routing_transformer.SelfAttention`` layer (its local
heads are ``local_attention.LocalAttention``, own window plus the previous one, causal; its
routing heads ``KmeansAttention``) built from the cell's config exactly as our first layer
resolves it (the layer ``--part attention`` times): the same width, heads and head width, the same
local/routing head split, the same local window (``local_attn_window_size = window``), the same
clusters and tokens per cluster (``window_size = w``, ``max_seq_len = K * w`` so that it derives
``K`` clusters), the same causality, shared QK, decay and commitment, and no relative-position
embeddings on either side (``rel_pos_emb=False``; ours has none). Input (B, T, D) requiring grad;
the step backpropagates ``out.sum()`` (the commitment loss is computed in the forward by both and
left out of the backward by both). In training mode lucidrains also runs its full Lloyd step on
every forward (``kmeans_iter``) and its first forward initialises the centroids from the data
(10 Lloyd iterations): that happens in the harness's warm-up, not in the timed steps.

Registered for every ``routing-*`` model name (``--part attention``); a config whose first layer
has no routing heads is reported as a skipped row with the reason.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..attention.routing import RoutingConfig
from .references import CellSpec, Workload, register_reference

__all__ = ["routing_transformer_reference", "routing_layer_shape"]


def routing_layer_shape(spec: CellSpec) -> dict[str, int | bool]:
    """How our first layer resolves the cell's routing config at length ``spec.seq_len``:
    routing/local heads, clusters ``K``, tokens per cluster ``w``, local window, shared QK."""
    c = spec.config
    attention = getattr(c, "attention", None)
    if not isinstance(attention, RoutingConfig):
        raise ValueError(
            f"routing-transformer stands beside routing attention only; this config's attention "
            f"is {getattr(attention, 'name', None)!r}"
        )
    a = attention.for_layer(0, c.n_layers)
    hr = c.n_heads // 2 if a.routing_heads is None else a.routing_heads
    if hr == 0:
        raise ValueError("the first layer has no routing heads (attention.skip_first > 0)")
    k = a.clusters if a.clusters is not None else max(1, round(math.sqrt(c.seq_len)))
    t = spec.seq_len
    w = a.cluster_window if a.cluster_window is not None else -(-t // k)
    return {
        "routing_heads": hr,
        "local_heads": c.n_heads - hr,
        "clusters": k,
        "cluster_window": max(1, min(w, t)),
        "window": a.window,
        "share_qk": bool(c.causal) if a.share_qk is None else a.share_qk,
    }


def routing_transformer_reference(spec: CellSpec) -> Workload:
    from routing_transformer.routing_transformer import SelfAttention  # the 'bench' extra

    c = spec.config
    s = routing_layer_shape(spec)
    a = c.attention
    layer = SelfAttention(
        c.dim,
        1,
        s["clusters"] * s["cluster_window"],
        c.n_heads,
        s["local_heads"],
        s["cluster_window"],
        dim_head=c.head_dim,
        local_attn_window_size=s["window"],
        causal=bool(c.causal),
        attn_dropout=0.0,
        dropout=0.0,
        kmeans_ema_decay=a.decay,
        commitment_factor=a.commitment,
        rel_pos_emb=False,
        shared_qk=s["share_qk"],
    )
    layer.to(device=spec.device, dtype=spec.dtype).train()
    x = torch.randn(spec.batch, spec.seq_len, c.dim, device=spec.device, dtype=spec.dtype)
    x.requires_grad_()  # (B, T, D)

    def forward() -> Tensor:
        out, _commitment = layer(x)  # (B, T, D), scalar
        return out

    return Workload(forward=forward, module=layer, inputs=(x,))


register_reference(
    "*",
    routing_transformer_reference,
    name="routing-transformer",
    parts=("attention",),
    requires=("routing_transformer",),
    attention=("routing",),
    description="lucidrains routing-transformer SelfAttention, same heads, clusters, window",
)
