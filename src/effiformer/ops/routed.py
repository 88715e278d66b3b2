"""Routed attention without keeping the gathered tiles: the kernel of the Routing Transformer's
content-routed heads, on the ops floor.

Each cluster is a batch row of ``w`` sorted token indices; its queries attend to its keys (under
the causal mask, the rank triangle: indices are sorted and distinct). The clusters go through the
CPU flash kernel in groups; the autograd node keeps q, k, v (the caller's tensors), the indices,
the per-cluster outputs and log-sum-exp only, and the backward gathers each group again and runs
the kernel's backward (what SDPA's autograd node runs), then scatters. Each token's output is the
mean over the clusters that chose it as a query (zero when none did).

    out = routed_flash_attention(q, k, v, q_idx, k_idx, causal=True, scale=s)   # (B, H, T, Dh)

How tokens are routed to clusters (k-means, top-w per centroid) is the mechanism's
(:mod:`effiformer.attention.routing`); whether a call can run here:
:func:`~effiformer.ops.strided_local.strided_unavailable`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .flash_cpu import flash_backward, flash_forward
from .strided_local import strided_unavailable

__all__ = ["cluster_groups", "gather_clusters", "routed_flash_attention"]


def gather_clusters(t: Tensor, idx: Tensor) -> Tensor:
    """t (B, H, T, Dh), idx (B, H, K, w) -> (B, H, K, w, Dh)."""
    b, h, k, w = idx.shape
    flat = idx.reshape(b, h, k * w, 1).expand(b, h, k * w, t.shape[-1])
    return t.gather(2, flat).view(b, h, k, w, t.shape[-1])


class _StridedRouted(torch.autograd.Function):
    """Routed attention without keeping the gathered tiles (see :func:`routed_attention`):
    clusters go through the CPU flash kernel in groups; the backward gathers each group again
    and runs the kernel's backward (what SDPA's autograd node runs), then scatters. The kernel
    sees each cluster as a batch row of one head, so its outputs are laid out (B, H, Kg, w, Dh)."""

    @staticmethod
    def forward(ctx, q, k, v, q_idx, k_idx, causal: bool, scale: float, same: bool):
        # k None: the keys are the queries (``same``); k_idx None: the indices are shared. Each
        # tensor comes in once (a tensor passed twice is a graph break under torch.compile).
        b, h, t, dh = v.shape
        kk, w = q_idx.shape[2], q_idx.shape[3]
        groups = cluster_groups(kk)
        out = v.new_zeros(b, h, t, dh)  # (B, H, T, Dh): sum over the clusters choosing t
        count = v.new_zeros(b, h, t)
        outs, lses = [], []
        for c0, c1 in groups:
            m = c1 - c0
            qi = q_idx[:, :, c0:c1]  # (B, H, Kg, w)
            ki = qi if k_idx is None else k_idx[:, :, c0:c1]
            qg = gather_clusters(q, qi).view(b * h * m, 1, w, dh)  # (B*H*Kg, 1, w, Dh)
            kg = qg if same else gather_clusters(k, ki).view(b * h * m, 1, w, dh)
            vg = gather_clusters(v, ki).view(b * h * m, 1, w, dh)
            o, lg = flash_forward(qg, kg, vg, 0.0, causal, scale=scale)  # (B*H*Kg, 1, w, Dh)
            qf = qi.reshape(b, h, m * w)
            out.scatter_add_(2, qf[..., None].expand(b, h, m * w, dh), o.view(b, h, m * w, dh))
            count.scatter_add_(2, qf, v.new_ones(b, h, m * w))
            outs.append(o)
            lses.append(lg)
            del qg, kg, vg
        count = count.clamp_min(1.0)  # (B, H, T)
        out.div_(count[..., None])
        ctx.save_for_backward(q, k, v, q_idx, k_idx, count, *outs, *lses)
        ctx.causal, ctx.scale, ctx.same, ctx.groups = causal, scale, same, groups
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, q_idx, k_idx, count, *rest = ctx.saved_tensors
        groups = ctx.groups
        outs, lses = rest[: len(groups)], rest[len(groups) :]
        b, h, t, dh = v.shape
        w = q_idx.shape[3]
        same = ctx.same
        dq = q.new_zeros(b, h, t, dh)
        dk = None if same else k.new_zeros(b, h, t, dh)
        dv = v.new_zeros(b, h, t, dh)
        for (c0, c1), o, lg in zip(groups, outs, lses, strict=True):
            m = c1 - c0
            qi = q_idx[:, :, c0:c1]  # (B, H, Kg, w)
            ki = qi if k_idx is None else k_idx[:, :, c0:c1]
            qf = qi.reshape(b, h, m * w, 1).expand(b, h, m * w, dh)
            kf = ki.reshape(b, h, m * w, 1).expand(b, h, m * w, dh)
            # d(sum / count): the output gradient over the count, gathered per cluster
            go = grad.gather(2, qf) / count.gather(2, qi.reshape(b, h, m * w))[..., None]
            qg = gather_clusters(q, qi).view(b * h * m, 1, w, dh)  # (B*H*Kg, 1, w, Dh)
            kg = qg if same else gather_clusters(k, ki).view(b * h * m, 1, w, dh)
            vg = gather_clusters(v, ki).view(b * h * m, 1, w, dh)
            gq, gk, gv = flash_backward(
                go.view(b * h * m, 1, w, dh), qg, kg, vg, o, lg, 0.0, ctx.causal, scale=ctx.scale
            )  # (B*H*Kg, 1, w, Dh) x 3
            if same:
                gq = gq + gk
            else:
                dk.scatter_add_(2, kf, gk.view(b, h, m * w, dh))
            dq.scatter_add_(2, qf, gq.view(b, h, m * w, dh))
            dv.scatter_add_(2, kf, gv.view(b, h, m * w, dh))
            del go, qg, kg, vg, gq, gk, gv
        return dq, dk, dv, None, None, None, None, None


def cluster_groups(k: int) -> list[tuple[int, int]]:
    """About 8 groups of consecutive clusters (bounded transients for the gathered tiles)."""
    g = max(1, -(-k // 8))
    return [(c0, min(k, c0 + g)) for c0 in range(0, k, g)]


def routed_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_idx: Tensor,
    k_idx: Tensor,
    *,
    causal: bool,
    scale: float,
) -> Tensor:
    """q, k, v (B, H, T, Dh); q_idx, k_idx (B, H, K, w) sorted token indices of each cluster's
    queries and keys -> (B, H, T, Dh). ``k_idx`` the same tensor as ``q_idx`` (shared QK) and
    ``k is q``: the keys are the gathered queries (one gather, summed gradients). Under
    ``causal`` the indices must be shared (the rank triangle is the causal mask only then)."""
    why = strided_unavailable(q)
    shared = q_idx is k_idx or torch.equal(q_idx, k_idx)
    if why is None and causal and not shared:
        why = "unshared indices need the positional causal mask (the gathered path builds it)"
    if why is not None:
        raise ValueError(f"strided routed attention cannot take this call: {why}")
    same = shared and k is q
    return _StridedRouted.apply(
        q, None if same else k, v, q_idx, None if shared else k_idx, causal, scale, same
    )
