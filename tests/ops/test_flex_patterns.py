"""The FlexAttention backend of the mask-expressible patterns (``ops/flex_patterns.py``): each
mechanism's ``mask_mod`` equals its own definition of the pattern element by element, and the
flex forward equals the CPU kernels' (on the CPU FlexAttention runs compiled and forward only,
so these compare inference; on CUDA the same masks train). One compile per pattern."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer.attention import AttentionDims, AttentionMask, build_attention
from effiformer.attention.local import local_attention, local_mask_mod, make_plan
from effiformer.attention.sparse import SparseConfig, pattern_mask, pattern_mask_mod
from effiformer.ops.flex_patterns import flex_unavailable

B, H, T, DH = 2, 4, 64, 8


def _grid(mask_mod, b, h, t):
    bi = torch.arange(b)[:, None, None, None]
    hi = torch.arange(h)[None, :, None, None]
    qi = torch.arange(t)[None, None, :, None]
    ki = torch.arange(t)[None, None, None, :]
    return mask_mod(bi, hi, qi, ki).expand(b, h, t, t)


@pytest.mark.parametrize("pattern, causal", [("strided", True), ("fixed", False), ("fixed", True)])
def test_the_sparse_mask_mod_is_the_pattern(pattern, causal):
    cfg = SparseConfig(pattern=pattern, stride=8, summary=2, num_verts=2)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, 50:] = False
    got = _grid(pattern_mask_mod(cfg, H, causal=causal, key_padding=real), B, H, T)
    want = pattern_mask(cfg, T, H, causal=causal)[None] & real[:, None, None, :]
    assert torch.equal(got, want)


@pytest.mark.parametrize("causal, back, fwd", [(True, 1, 0), (False, 1, 1), (False, 2, 0)])
def test_the_local_mask_mod_is_the_plan(causal, back, fwd):
    t, w = 37, 8  # the last chunk is short
    plan = make_plan(t, w, back, fwd, causal=causal)
    got = _grid(local_mask_mod(plan), 1, 1, t)[0, 0]
    want = torch.zeros(t, t, dtype=torch.bool)  # from the plan's own (chunk, row, key) mask
    keep = plan.keep  # (n, w, K) over the neighbour chunks' keys
    for c in range(plan.n_chunks):
        for i in range(w):
            qpos = c * w + i
            if qpos >= t:
                continue
            for j, o in enumerate(plan.offsets):
                for r in range(w):
                    kpos = (c + o) * w + r
                    if keep[c, i, j * w + r]:
                        want[qpos, kpos] = True
    assert torch.equal(got, want)


@pytest.mark.parametrize("pattern, causal", [("strided", True), ("fixed", False)])
def test_a_sparse_layer_through_flex_equals_the_tiled_kernel(pattern, causal):
    torch.manual_seed(0)
    dims = AttentionDims(32, H, DH, causal=causal)
    tiled = build_attention(SparseConfig(pattern=pattern, stride=8, summary=2), dims).eval()
    flex = build_attention(SparseConfig(pattern=pattern, stride=8, summary=2, impl="flex"), dims)
    flex.load_state_dict(tiled.state_dict())
    x = torch.randn(B, T, 32)
    real = None if causal else torch.ones(B, T, dtype=torch.bool)
    if real is not None:
        real[1, 50:] = False
    mask = AttentionMask(causal=causal, key_padding=real)
    with torch.no_grad():
        assert_close(flex.eval()(x, mask=mask).out, tiled(x, mask=mask).out, rtol=1e-5, atol=1e-5)
    # training on the CPU: FlexAttention has no backward here, and says so
    with pytest.raises(ValueError, match="no backward on the CPU"):
        flex(x.requires_grad_(), mask=mask)


def test_local_attention_through_flex_equals_the_cpu_kernels():
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, T, H, DH) for _ in range(3))
    for causal, back, fwd in ((True, 1, 0), (False, 1, 1)):
        plan = make_plan(T, 16, back, fwd, causal=causal)
        with torch.no_grad():
            want = local_attention(q, k, v, plan)
            got = local_attention(q, k, v, plan, flex=True)
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_what_flex_cannot_run_says_why():
    q = torch.randn(1, 1, 4, 2, requires_grad=True)
    assert "no backward on the CPU" in flex_unavailable(q, needs_grad=True)
    assert flex_unavailable(q, needs_grad=False) is None
    assert flex_unavailable(q.detach(), needs_grad=True) is None


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_on_cuda_the_tiled_impl_trains_through_flex_and_matches_the_dense_mask(pattern):
    """The device backend: on CUDA ``impl="tiled"`` plans a block mask and runs FlexAttention,
    forward and backward, equal (bf16 tolerance) to the dense masked reference."""
    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run under -m gpu on a GPU machine)")
    torch.manual_seed(0)
    dims = AttentionDims(256, 4, 64, causal=True)
    cfg = SparseConfig(pattern=pattern, stride=64, summary=16)
    flex = build_attention(cfg, dims).cuda()
    ref = build_attention(SparseConfig(pattern=pattern, stride=64, summary=16, impl="dense"), dims)
    ref = ref.cuda()
    ref.load_state_dict(flex.state_dict())
    x = torch.randn(2, 1024, 256, device="cuda", requires_grad=True)
    mask = AttentionMask(causal=True)
    out = flex(x, mask=mask).out
    want = ref(x, mask=mask).out
    assert_close(out, want, rtol=2e-3, atol=2e-3)
    g = torch.randn_like(out)
    (ga,) = torch.autograd.grad(out, x, g)
    (gb,) = torch.autograd.grad(want, x, g)
    assert_close(ga, gb, rtol=5e-3, atol=5e-3)
