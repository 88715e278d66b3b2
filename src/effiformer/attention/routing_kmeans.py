"""The Routing Transformer's online k-means and balanced routing (Roy et al. 2020/2021, arXiv
2003.05997, sec. 4.2; official ``utils.py`` ``online_kmeans``, ``cluster_items``): the functions
:mod:`.routing` calls, one floor of the mechanism kept apart so the part's file holds the layer.

**Online mini-batch k-means outside the optimiser** (official ``online_kmeans``, the VQ-VAE EMA
of van den Oord et al. 2017, app. A.1): every real token is assigned to its highest-scoring
centroid; the per-cluster counts ``n_c`` and sums ``s_c`` of the normalised vectors are
accumulated as EMAs with decay ``decay`` (0.999 in the released hyper-parameters),
``N <- decay N + (1 - decay) n`` and ``S <- decay S + (1 - decay) s``; the centroids are
``mu = S / N~`` with the Laplace-smoothed counts ``N~_c = (N_c + eps) / (sum N + K eps) * sum N``
(official ``epsilon = 1e-5``), never renormalised. ``S`` starts at the initial centroids
``LN(N(0, 1))`` (unit vectors for ``"l2"``) and ``N`` at zero, as the official ``ema_means`` /
``ema_count`` variables; until the first update the centroids are ``S`` itself.

Data parallelism and micro-batches
----------------------------------
The official update all-reduces the *statistics* (``cross_replica_sum`` of ``n`` and ``s``) before
the EMA; averaging EMA'd *centroids* across ranks would not equal that (the mean of ratios is not
the ratio of sums). Here the update carries the EMA'd sums and counts themselves, which are linear
in the statistics: the mean over R ranks and M micro-batches of ``decay B + (1 - decay) s_r`` is
``decay B + (1 - decay) (sum_r s_r) / (R M)``, the official all-reduced EMA with the statistics
of the global batch divided by ``R M``. Both ``S`` and ``N`` carry the same factor, which cancels
in ``mu = S / N~``: the centroids follow the one-process trajectory of the same global batch
(exactly, up to floating point, when that process also splits it into ``R M`` micro-batches).
The factor shows only in the two constants of the recursion: the initial pseudo-sum ``S_0 = mu_0``
(whose weight decays as ``decay^t``) and the Laplace ``eps``, both weighed against per-contribution
rather than global counts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "LN_EPS",
    "QK_NORMS",
    "centroids_from",
    "ema_update",
    "kmeans_statistics",
    "normalize_qk",
    "route",
]

QK_NORMS = ("layernorm", "l2")
LN_EPS = 1e-6  # the official layer_norm's epsilon


def normalize_qk(x: Tensor, kind: str) -> Tensor:
    """(..., Dh) -> (..., Dh): LayerNorm without scale or bias (norm sqrt(Dh)) or unit L2."""
    if kind == "layernorm":
        return F.layer_norm(x, x.shape[-1:], eps=LN_EPS)
    if kind == "l2":
        return F.normalize(x, dim=-1)
    raise ValueError(f"kind must be one of {list(QK_NORMS)}, got {kind!r}")


def centroids_from(sums: Tensor, counts: Tensor, epsilon: float) -> Tensor:
    """Centroids (H, K, Dh) from EMA sums (H, K, Dh) and counts (H, K): ``S / N~`` with
    Laplace-smoothed counts ``N~ = (N + eps) / (sum N + K eps) * sum N`` (per head); a head whose
    counts are all zero (no update yet) keeps ``S``."""
    k = counts.shape[-1]
    total = counts.sum(-1, keepdim=True)  # (H, 1)
    smoothed = (counts + epsilon) / (total + k * epsilon) * total  # (H, K)
    started = total > 0  # (H, 1)
    safe = torch.where(started, smoothed, torch.ones_like(smoothed))
    return torch.where(started[..., None], sums / safe[..., None], sums)


@torch.no_grad()
def kmeans_statistics(
    x: Tensor, centroids: Tensor, weight: Tensor | None = None, scores: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """One mini-batch of k-means statistics.

    x: (B, H, T, Dh) normalised vectors; centroids: (H, K, Dh); weight: (B, T) 1 for real tokens,
    0 for padding (or None); scores: the (B, H, T, K) dot products ``x . mu`` when already
    computed. Returns counts (H, K), sums (H, K, Dh) of the vectors assigned to each centroid
    (highest dot product), and the assignment (B, H, T)."""
    if scores is None:
        scores = x @ centroids.to(x.dtype).transpose(-1, -2)  # (B, H, T, K)
    assign = scores.argmax(dim=-1)  # (B, H, T)
    b, h, t = assign.shape
    onehot = x.new_zeros(b, h, t, centroids.shape[1], dtype=torch.float32)  # (B, H, T, K)
    onehot.scatter_(-1, assign[..., None], 1.0)
    if weight is not None:
        onehot = onehot * weight[:, None, :, None].float()
    counts = onehot.sum(dim=(0, 2))  # (H, K)
    sums = torch.einsum("bhtk,bhtd->hkd", onehot, x.float())  # (H, K, Dh)
    return counts, sums, assign


def ema_update(
    sums: Tensor, counts: Tensor, new_sums: Tensor, new_counts: Tensor, decay: float
) -> tuple[Tensor, Tensor]:
    """``S <- decay S + (1 - decay) s``, ``N <- decay N + (1 - decay) n``."""
    return (
        decay * sums + (1.0 - decay) * new_sums.to(sums.dtype),
        decay * counts + (1.0 - decay) * new_counts.to(counts.dtype),
    )


def route(scores: Tensor, window: int, real: Tensor | None = None) -> Tensor:
    """Balanced routing: scores (B, H, K, T) -> indices (B, H, K, w), each centroid's ``w``
    highest-scoring tokens sorted by position. Padded tokens (``real`` (B, T) False) score
    ``-inf`` so they are taken only when fewer than ``w`` tokens are real."""
    if real is not None:
        scores = scores.masked_fill(~real[:, None, None, :], float("-inf"))
    idx = scores.topk(window, dim=-1, sorted=False).indices  # (B, H, K, w)
    return idx.sort(dim=-1).values
