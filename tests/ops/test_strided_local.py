"""The strided local op (``ops/strided_local.py``): chunked attention read in place equals plain
attention under the chunk mask (forward and every gradient, float64, a length that is not a
multiple of the window, causal and not, one and two chunks back), passes gradcheck, and names
each reason it cannot run."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer.ops import flash_cpu
from effiformer.ops.strided_local import strided_local_attention, strided_unavailable

pytestmark = pytest.mark.skipif(
    not flash_cpu.flash_available(), reason="this torch build has no CPU flash kernel"
)


def _reference(q, k, v, window, back, fwd, causal, scale):
    """O(T^2) attention over (B, T, H, Dh) with key j visible to query i iff its chunk lies
    ``back`` before to ``fwd`` after i's (and j <= i under ``causal``)."""
    t = q.shape[1]
    pos = torch.arange(t)
    d = pos[None, :] // window - pos[:, None] // window  # key chunk - query chunk, (T, T)
    keep = (d >= -back) & (d <= (0 if causal else fwd))
    if causal:
        keep &= pos[None, :] <= pos[:, None]
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("back", "fwd"), [(1, 0), (2, 1), (0, 1)])
def test_forward_and_gradients_equal_plain_attention_under_the_chunk_mask(causal, back, fwd):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 37, 3, 8, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))  # fmt: skip
    kw = dict(window=8, back=back, fwd=fwd, causal=causal)
    out = strided_local_attention(q, k, v, scale=0.3, **kw)
    ref = _reference(q, k, v, 8, back, fwd, causal, 0.3)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_gradcheck():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 11, 2, 4, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))  # fmt: skip

    def f(q, k, v):
        return strided_local_attention(q, k, v, window=4, back=1, fwd=0, causal=True)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_every_refusal_names_its_reason():
    q = torch.randn(1, 8, 2, 4)
    assert strided_unavailable(q) is None
    assert "dropout" in strided_unavailable(q, dropout_p=0.1)
    assert "key padding" in strided_unavailable(q, key_padding=torch.ones(1, 8, dtype=torch.bool))
    assert "bfloat16" in strided_unavailable(q.bfloat16())
    with pytest.raises(ValueError, match="cannot take this call: .*bfloat16"):
        strided_local_attention(*(q.bfloat16(),) * 3, window=4, back=1, fwd=0, causal=True)
    with pytest.raises(ValueError, match="window must be >= 1"):
        strided_local_attention(q, q, q, window=0, back=1, fwd=0, causal=True)
