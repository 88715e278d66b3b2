"""Adaptive input embeddings and adaptive softmax, with tied weights and projections.

- Adaptive softmax: Grave, Joulin, Cisse, Grangier, Jegou 2017, "Efficient softmax approximation
  for GPUs", arXiv 1609.04309, sec. 4 (two-level hierarchy: a head over the shortlist plus one
  "cluster" logit per tail, and a tail softmax per cluster; p(w) = p(cluster) p(w | cluster)).
- Adaptive input: Baevski & Auli 2019, "Adaptive Input Representations for Neural Language
  Modeling", arXiv 1809.10853, sec. 3: cluster ``i`` embeds into ``d / div_val**i`` dimensions and
  is projected to ``d``; the softmax may share both the embeddings and the projections.
- As used by Transformer-XL (Dai et al. 2019, arXiv 1901.02860; official
  ``pytorch/utils/proj_adaptive_softmax.py`` and ``mem_transformer.AdaptiveEmbedding``): the
  embeddings are scaled by ``sqrt(dim)``; with ``div_val == 1`` every cluster has the full width
  and there is no projection unless ``embed_dim != dim``; with ``div_val > 1`` every cluster, the
  head included, has its own projection.

Why not ``torch.nn.AdaptiveLogSoftmaxWithLoss``: its tails are fixed ``Linear(d, d/div^i) ->
Linear(d/div^i, n_i)`` stacks that cannot share weights with the input embeddings or their
projections, its head cannot share the shortlist embedding, and it has no ``div_val == 1``
"one matrix sliced per cluster" mode; Transformer-XL ties all of these, so we need our own.

Deviations (they only matter when porting official weights): the cluster logits of the head are
ordered cluster 1, 2, ... (the official code reads cluster ``i`` from column ``-i``, i.e.
reversed); with ``div_val == 1`` the official single (V, d) matrix is stored as one (n_i, d) table
per cluster (the same numbers split by rows; slicing one tied matrix per cluster made every
backward allocate and fill full-vocabulary gradients, 10 s per step for WT103's 110M-weight
table on CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AdaptiveInput", "AdaptiveLogSoftmax", "check_cutoffs"]


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32 or wider: log-softmax is computed at least in float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def check_cutoffs(cutoffs: tuple[int, ...], vocab_size: int) -> None:
    prev = 0
    for c in cutoffs:
        if isinstance(c, bool) or not isinstance(c, int) or not prev < c < vocab_size:
            raise ValueError(
                f"cutoffs must be strictly increasing ints in (0, vocab_size={vocab_size}), "
                f"got {tuple(cutoffs)}"
            )
        prev = c


def _cluster_dims(embed_dim: int, n_clusters: int, div_val: int) -> list[int]:
    dims = [embed_dim // div_val**i for i in range(n_clusters)]
    if min(dims) < 1:
        raise ValueError(
            f"div_val={div_val} leaves cluster {dims.index(min(dims))} with no embedding "
            f"dimensions (embed_dim={embed_dim}); lower div_val or use fewer cutoffs"
        )
    return dims


class AdaptiveInput(nn.Module):
    """Token ids (B, T) -> embeddings (B, T, dim), scaled by sqrt(dim).

    Args:
        vocab_size: V.
        embed_dim: width of the head cluster's embedding (cluster i: ``embed_dim // div_val**i``).
        dim: model width.
        cutoffs: cluster boundaries, e.g. (20000, 40000, 200000); () = one cluster.
        div_val: width divisor per cluster.
        scale: multiply the embeddings by sqrt(dim) (Transformer-XL); ``False``: unscaled
            (the adaptive-span code's plain ``nn.Embedding``).
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        dim: int,
        *,
        cutoffs: tuple[int, ...] = (),
        div_val: int = 1,
        scale: bool = True,
    ) -> None:
        super().__init__()
        check_cutoffs(cutoffs, vocab_size)
        self.vocab_size, self.dim, self.div_val = vocab_size, dim, div_val
        self.bounds = [0, *cutoffs, vocab_size]
        n = len(self.bounds) - 1
        self.scale = dim**0.5 if scale else 1.0
        dims = [embed_dim] * n if div_val == 1 else _cluster_dims(embed_dim, n, div_val)
        # One table per cluster (with div_val 1 these are row blocks of the official single
        # matrix: same function, and no full-vocabulary slice gradients in the tied softmax).
        self.emb_layers = nn.ModuleList(
            nn.Embedding(
                self.bounds[i + 1] - self.bounds[i],
                d,
                _weight=torch.empty(self.bounds[i + 1] - self.bounds[i], d).normal_(std=0.02),
            )
            for i, d in enumerate(dims)
        )
        if div_val == 1:  # one projection shared by every cluster, only if widths differ
            projs = [] if embed_dim == dim else [nn.Parameter(torch.empty(dim, embed_dim))]
        else:
            projs = [nn.Parameter(torch.empty(dim, d)) for d in dims]
        self.projs = nn.ParameterList(projs)  # each (dim, d_i); empty when no projection
        for p in self.projs:
            nn.init.normal_(p, std=0.01)

    def proj(self, i: int) -> Tensor | None:
        """Projection (dim, d_i) of cluster ``i``, or None."""
        if not len(self.projs):
            return None
        return self.projs[0] if self.div_val == 1 else self.projs[i]

    def forward(self, input_ids: Tensor) -> Tensor:
        if len(self.emb_layers) == 1:
            x = self.emb_layers[0](input_ids)  # (B, T, embed_dim)
            if self.proj(0) is not None:
                x = F.linear(x, self.proj(0))  # (B, T, dim)
            return x * self.scale
        flat = input_ids.reshape(-1)  # (N,)
        out = None
        for i, emb in enumerate(self.emb_layers):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            idx = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            e = emb(flat[idx] - lo)  # (n_i, d_i)
            if self.proj(i) is not None:
                e = F.linear(e, self.proj(i))  # (n_i, dim)
            if out is None:
                out = e.new_zeros(flat.shape[0], self.dim)
            out = out.index_copy(0, idx, e)
        return out.view(*input_ids.shape, self.dim) * self.scale  # (B, T, dim)


class AdaptiveLogSoftmax(nn.Module):
    """Adaptive softmax over V tokens from hidden states of width ``dim``.

    ``log_prob(h (N, dim)) -> (N, V)`` (sums to 1 over V); ``nll(h (N, dim), target (N,)) -> (N,)``
    computes only the tails its targets need. With ``tie_to`` the token weights are the
    :class:`AdaptiveInput`'s embedding matrices (the same ``Parameter`` objects) and, with
    ``tie_projs``, the tail clusters' projections are its projections too; with ``div_val > 1``
    the head cluster's projection stays untied, as in the official WT103 scripts (``tie_projs =
    [False] + [True] * len(cutoffs)``); with ``div_val == 1`` there is at most one projection,
    shared by all clusters (tied when ``tie_projs``). Every token has its own output bias.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        dim: int,
        *,
        cutoffs: tuple[int, ...] = (),
        div_val: int = 1,
        tie_to: AdaptiveInput | None = None,
        tie_projs: bool = False,
    ) -> None:
        super().__init__()
        check_cutoffs(cutoffs, vocab_size)
        self.vocab_size, self.dim, self.div_val = vocab_size, dim, div_val
        self.bounds = [0, *cutoffs, vocab_size]
        self.n_clusters = len(cutoffs)
        self.shortlist = self.bounds[1]
        n = self.n_clusters + 1
        if tie_to is not None and (
            tie_to.bounds != self.bounds or tie_to.div_val != div_val or tie_to.dim != dim
        ):
            raise ValueError("tie_to must have the same vocabulary, cutoffs, div_val and dim")
        dims = [embed_dim] * n if div_val == 1 else _cluster_dims(embed_dim, n, div_val)
        if tie_to is not None:
            weights = [e.weight for e in tie_to.emb_layers]
        else:
            weights = [
                nn.Parameter(torch.empty(self.bounds[i + 1] - self.bounds[i], d).normal_(std=0.02))
                for i, d in enumerate(dims)
            ]
        needs_proj = div_val > 1 or embed_dim != dim
        projs = []
        for i, d in enumerate(dims[: 1 if div_val == 1 else n] if needs_proj else []):
            # div_val 1: one projection shared by all clusters, tied when tie_projs;
            # div_val > 1: the head's projection is never tied, the tails' are when tie_projs.
            if tie_to is not None and tie_projs and (div_val == 1 or i > 0):
                projs.append(tie_to.projs[i])
            else:
                p = nn.Parameter(torch.empty(dim, d))
                nn.init.normal_(p, std=0.01)
                projs.append(p)
        self.weights = nn.ParameterList(weights)  # (n_i, d_i) per cluster
        self.projs = nn.ParameterList(projs)  # (dim, d_i) each, or empty
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        if self.n_clusters:  # head logits of the tail clusters
            self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters, dims[0]))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
            nn.init.normal_(self.cluster_weight, std=0.02)
        else:
            self.register_parameter("cluster_weight", None)
            self.register_parameter("cluster_bias", None)

    def _cluster(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Weight (n_i, d_i), bias (n_i,), projection (dim, d_i) or None of cluster ``i``."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        if not len(self.projs):
            proj = None
        else:
            proj = self.projs[0] if self.div_val == 1 else self.projs[i]
        return self.weights[i], self.bias[lo:hi], proj

    @staticmethod
    def _logits(h: Tensor, w: Tensor, b: Tensor, proj: Tensor | None) -> Tensor:
        if proj is not None:
            h = h @ proj  # (N, dim) @ (dim, d_i) -> (N, d_i)
        return F.linear(h, w, b)  # (N, n_i)

    def _head_logprob(self, h: Tensor) -> Tensor:
        """(N, dim) -> (N, shortlist + n_clusters) log-probs of shortlist tokens and clusters."""
        w, b, proj = self._cluster(0)
        if self.n_clusters:
            w = torch.cat([w, self.cluster_weight], dim=0)
            b = torch.cat([b, self.cluster_bias], dim=0)
        return F.log_softmax(self._logits(h, w, b, proj).to(_wide(h.dtype)), dim=-1)

    def _check_hidden(self, h: Tensor) -> None:
        if h.dim() != 2 or h.shape[1] != self.dim:
            raise ValueError(f"hidden must be (N, {self.dim}), got {tuple(h.shape)}")

    def logits(self, h: Tensor) -> Tensor:
        """(N, dim) -> (N, V) scores whose softmax is the model's distribution: the raw logits
        when there is a single cluster (plain tied softmax), the log-probabilities otherwise."""
        if self.n_clusters == 0:
            self._check_hidden(h)
            return self._logits(h, *self._cluster(0))
        return self.log_prob(h)

    def log_prob(self, h: Tensor) -> Tensor:
        """Full log-distribution: (N, dim) -> (N, V), float32 or wider."""
        self._check_hidden(h)
        head = self._head_logprob(h)  # (N, shortlist + n_clusters)
        parts = [head[:, : self.shortlist]]
        for i in range(1, self.n_clusters + 1):
            tail = F.log_softmax(
                self._logits(h, *self._cluster(i)).to(_wide(h.dtype)), dim=-1
            )  # (N, n_i)
            parts.append(head[:, self.shortlist + i - 1, None] + tail)
        return torch.cat(parts, dim=-1)  # (N, V)

    def nll(self, h: Tensor, target: Tensor) -> Tensor:
        """Negative log-likelihood per row, (N, dim), (N,) -> (N,); computes only needed tails."""
        self._check_hidden(h)
        if target.shape != h.shape[:1]:
            raise ValueError(f"target must be (N={h.shape[0]},), got {tuple(target.shape)}")
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= self.vocab_size):
            raise ValueError(f"target ids must be in [0, {self.vocab_size})")
        head = self._head_logprob(h)  # (N, shortlist + n_clusters)
        in_head = target < self.shortlist
        nll = -head.gather(1, target.clamp(max=self.shortlist - 1)[:, None]).squeeze(1)
        nll = torch.where(in_head, nll, torch.zeros_like(nll))
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            idx = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            tail = F.log_softmax(self._logits(h[idx], *self._cluster(i)).to(_wide(h.dtype)), dim=-1)
            lp = (
                head[idx, self.shortlist + i - 1]
                + tail.gather(1, (target[idx] - lo)[:, None])[:, 0]
            )
            nll = nll.index_put((idx,), -lp)
        return nll
