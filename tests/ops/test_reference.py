"""The O(T^2) references of ``ops/reference.py``: the plain softmax with ``-inf`` masking and the
SDPA one that gives zeros for a row without keys agree wherever a row has a key, and both equal
the textbook formula."""

import torch
from torch.testing import assert_close

from effiformer.ops.reference import masked_attention, reference_attention


def test_the_two_references_agree_and_follow_the_formula():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 5, dtype=torch.float64, generator=g) for _ in range(3))
    keep = torch.rand(2, 3, 7, 7, generator=g) > 0.4
    keep[0, 0, 2] = False  # one row sees nothing
    a = reference_attention(q, k, v, keep)
    b = masked_attention(q, k, v, keep)
    has = keep.any(-1)
    assert_close(a[has], b[has], rtol=1e-12, atol=1e-12)
    assert torch.isnan(a[0, 0, 2]).all() and (b[0, 0, 2] == 0).all()
    s = (q @ k.transpose(-1, -2)) / 5**0.5
    w = torch.where(keep, s.exp(), torch.zeros_like(s))
    want = (w / w.sum(-1, keepdim=True)) @ v
    assert_close(a[has], want[has], rtol=1e-12, atol=1e-12)
