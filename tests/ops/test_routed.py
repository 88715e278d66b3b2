"""The routed op (``ops/routed.py``): attention inside each cluster of sorted token indices,
each token the mean over the clusters that chose it, equals an explicit per-cluster loop
(forward and every gradient, float64, shared and unshared indices, causal and not), passes
gradcheck, and refuses what it cannot run with the reason."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer.ops import flash_cpu
from effiformer.ops.routed import gather_clusters, routed_flash_attention

pytestmark = pytest.mark.skipif(
    not flash_cpu.flash_available(), reason="this torch build has no CPU flash kernel"
)


def _indices(b, h, t, clusters, w, g):
    """(B, H, K, w) sorted distinct token indices per cluster (tokens may sit in several)."""
    scores = torch.rand(b, h, clusters, t, generator=g)
    return scores.topk(w, dim=-1).indices.sort(dim=-1).values


def _reference(q, k, v, q_idx, k_idx, causal, scale):
    b, h, t, dh = v.shape
    out = torch.zeros_like(v)
    count = torch.zeros(b, h, t, dtype=v.dtype)
    for bi in range(b):
        for hi in range(h):
            for c in range(q_idx.shape[2]):
                qi, ki = q_idx[bi, hi, c], k_idx[bi, hi, c]
                s = q[bi, hi, qi] @ k[bi, hi, ki].T * scale  # (w, w)
                if causal:
                    s = s.masked_fill(ki[None, :] > qi[:, None], float("-inf"))
                o = torch.softmax(s, -1) @ v[bi, hi, ki]
                out[bi, hi] = out[bi, hi].index_add(0, qi, o)
                count[bi, hi] = count[bi, hi].index_add(0, qi, torch.ones(len(qi), dtype=v.dtype))
    return out / count.clamp_min(1)[..., None]


@pytest.mark.parametrize(("causal", "shared", "same"),
                         [(True, True, True), (True, True, False), (False, False, False)])  # fmt: skip
def test_forward_and_gradients_equal_a_loop_over_clusters(causal, shared, same):
    g = torch.Generator().manual_seed(11)
    b, h, t, dh, kk, w = 2, 2, 24, 4, 5, 6
    q, k, v = (torch.randn(b, h, t, dh, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))  # fmt: skip
    if same:
        k = q
    q_idx = _indices(b, h, t, kk, w, g)
    k_idx = q_idx if shared else _indices(b, h, t, kk, w, g)
    out = routed_flash_attention(q, k, v, q_idx, k_idx, causal=causal, scale=0.4)
    ref = _reference(q, k, v, q_idx, k_idx, causal, 0.4)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    wgt = torch.randn(out.shape, generator=g, dtype=torch.float64)
    leaves = (q, v) if same else (q, k, v)
    got = torch.autograd.grad((out * wgt).sum(), leaves)
    want = torch.autograd.grad((ref * wgt).sum(), leaves)
    for a, b_ in zip(got, want, strict=True):
        assert_close(a, b_, rtol=1e-11, atol=1e-12)


def test_gradcheck_and_the_gather():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 9, 3, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))  # fmt: skip
    idx = _indices(1, 1, 9, 3, 4, g)
    assert torch.equal(gather_clusters(v, idx)[0, 0, 1], v[0, 0, idx[0, 0, 1]])

    def f(q, k, v):
        return routed_flash_attention(q, k, v, idx, idx, causal=True, scale=0.5)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_refusals_name_their_reason():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 8, 4)
    a, b = _indices(1, 1, 8, 2, 4, g), _indices(1, 1, 8, 2, 4, g)
    with pytest.raises(ValueError, match="unshared indices need the positional causal mask"):
        routed_flash_attention(q, q, q, a, b, causal=True, scale=1.0)
    with pytest.raises(ValueError, match="cannot take this call: .*bfloat16"):
        routed_flash_attention(*(q.bfloat16(),) * 3, a, a, causal=True, scale=1.0)
