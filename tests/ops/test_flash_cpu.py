"""The CPU flash-attention op of the ops floor: forward output and log-sum-exp, and the backward,
equal the plain-matmul attention (float64, causal, additive and -inf masks, a scale), and the
one availability check names each reason it cannot run."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer.ops import flash_cpu
from effiformer.ops.flash_cpu import flash_backward, flash_forward, flash_unavailable

pytestmark = pytest.mark.skipif(
    not flash_cpu.flash_available(), reason="this torch build has no CPU flash kernel"
)


def _reference(q, k, v, causal, mask, scale):
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    if causal:
        tq, tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "additive", "-inf"])
def test_forward_and_backward_equal_plain_attention(causal, mask_kind):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = None
    if mask_kind == "additive":
        mask = torch.randn(7, 7, generator=g, dtype=torch.float64)
    elif mask_kind == "-inf":  # a keep-mask as the kernel takes it: 0 or -inf, q's dtype
        keep = torch.rand(7, 7, generator=g) > 0.3
        keep[:, 0] = True  # every row keeps a key
        mask = torch.zeros(7, 7, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    scale = 0.37
    out, lse = flash_forward(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    want, want_lse = _reference(qr, kr, vr, causal, mask, scale)
    assert_close(out, want.detach(), rtol=1e-10, atol=1e-10)
    assert_close(lse.double(), want_lse.detach(), rtol=1e-10, atol=1e-10)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    dq, dk, dv = flash_backward(grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale)
    rq, rk, rv = torch.autograd.grad(want, (qr, kr, vr), grad)
    for got, exp in ((dq, rq), (dk, rk), (dv, rv)):
        assert_close(got, exp, rtol=1e-9, atol=1e-9)


def test_the_availability_check_names_each_reason(monkeypatch):
    q = torch.randn(1, 1, 4, 2)
    assert flash_unavailable(q) is None
    assert flash_unavailable(q.double(), dtypes=(torch.float64,)) is None
    assert flash_unavailable(q.half(), dtypes=(torch.float32, torch.float64)) == (
        "it takes float32 or float64 (got torch.float16)"
    )
    assert "dropout" in flash_unavailable(q, dropout_p=0.1)
    assert "got a meta tensor" in flash_unavailable(q.to("meta"))
    monkeypatch.setattr(flash_cpu, "flash_backward", None)
    assert flash_unavailable(q) == "this torch build has no CPU flash-attention kernel"
