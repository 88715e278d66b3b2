"""Relative-position embeddings of keys and values, in tensor2tensor's form (Shaw, Uszkoreit,
Vaswani 2018, "Self-Attention with Relative Position Representations", arXiv 1803.02155; T2T
``dot_product_attention_relative`` / ``_relative_attention_inner``, which the Routing
Transformer's released models use in both head types with ``max_relative_position`` 513).

For a query at (relative) coordinate ``i`` and a key at ``j``, the clipped distance
``r = clip(j - i, -M, M) + M`` indexes two learned tables of shape (2M + 1, Dh), shared by the
heads of one attention type in one layer: ``a_K`` adds ``q . a_K[r]`` to the logit and ``a_V``
adds ``sum_j w_ij a_V[r_ij]`` to the output::

    logits_ij = scale * q_i . (k_j + a_K[r_ij])
    out_i     = sum_j w_ij (v_j + a_V[r_ij]),   w = softmax(logits + mask)

What the coordinate is belongs to the caller: the token distance in local blocks, the rank inside
a cluster's position-sorted window in the Routing Transformer's routed heads. The tables start
as T2T's default initializer in those models does (``uniform_unit_scaling`` with the released
``initializer_gain`` 0.2: uniform in ``+-0.2 sqrt(3 / (2M + 1))``).

Cost: the two extra terms are batched matmuls of the same size as ``q k^T`` and ``w v`` against the
(Lq, Lk, Dh) gathered tables, which every block or cluster shares (the distances of a block-local
or a rank window do not depend on the block); the logits are materialised (no fused kernel).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import keep_init

__all__ = ["RelativeTables", "relative_attention", "relative_index"]

#: T2T's ``initializer_gain`` in the Routing Transformer's released hyper-parameters
INIT_GAIN = 0.2


class RelativeTables(nn.Module):
    """The key and value tables ``a_K``, ``a_V`` (2 * max_distance + 1, head_dim) of one
    attention type in one layer."""

    def __init__(self, max_distance: int, head_dim: int) -> None:
        super().__init__()
        if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
            raise ValueError(f"max_distance must be an int >= 1, got {max_distance!r}")
        self.max_distance = max_distance
        n = 2 * max_distance + 1
        bound = INIT_GAIN * math.sqrt(3.0 / n)
        self.keys = keep_init(nn.Parameter(torch.empty(n, head_dim).uniform_(-bound, bound)))
        self.values = keep_init(nn.Parameter(torch.empty(n, head_dim).uniform_(-bound, bound)))

    def index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(Lq,), (Lk,) coordinates -> (Lq, Lk) table rows (see :func:`relative_index`)."""
        return relative_index(q_pos, k_pos, self.max_distance)


def relative_index(q_pos: Tensor, k_pos: Tensor, max_distance: int) -> Tensor:
    """``clip(k - q, -M, M) + M``: (Lq,), (Lk,) integer coordinates -> (Lq, Lk) long."""
    d = k_pos[None, :].long() - q_pos[:, None].long()
    return d.clamp(-max_distance, max_distance) + max_distance


def relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None,
    index: Tensor,
    tables: RelativeTables,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention with relative key and value embeddings (see the module docstring).

    q (..., Lq, Dh), k, v (..., Lk, Dh); keep: bool broadcastable to (..., Lq, Lk), True where a
    query may see a key (every row should keep at least one key; a row that keeps none gets a
    uniform average rather than NaN); index (Lq, Lk) rows of the tables. -> (..., Lq, Dh)."""
    a_k = tables.keys.to(q.dtype)[index]  # (Lq, Lk, Dh)
    a_v = tables.values.to(v.dtype)[index]
    qs = q * scale
    logits = qs @ k.transpose(-1, -2)  # (..., Lq, Lk)
    # q_i . a_K[r_ij]: one (Lk, Dh) matrix per query row, shared by the leading dims
    lead = q.shape[:-2]
    qr = qs.reshape(-1, q.shape[-2], q.shape[-1]).transpose(0, 1)  # (Lq, N, Dh)
    logits = logits + (qr @ a_k.transpose(-1, -2)).transpose(0, 1).reshape(*lead, *index.shape)
    if keep is not None:
        logits = logits.masked_fill(~keep, torch.finfo(logits.dtype).min)
    w = torch.softmax(logits, dim=-1)
    if dropout_p > 0.0:
        w = torch.nn.functional.dropout(w, p=dropout_p)
    out = w @ v  # (..., Lq, Dh)
    wr = w.reshape(-1, *index.shape).transpose(0, 1)  # (Lq, N, Lk)
    return out + (wr @ a_v).transpose(0, 1).reshape(*lead, q.shape[-2], v.shape[-1])
