"""The Sparse Transformer's tiled engine as registered operators
(``effiformer::tiled_sparse_forward`` / ``_backward``): torch.library's consistency checks (fake
implementations, autograd registration, schema) on the strided and fixed plans, with padding, and
the plan's structure surviving its JSON round trip (issue 24: every tile call unrolled into the
compiled graph made ``torch.compile`` of ``sparse-tiny`` take 766 s; one opaque op: 26 s)."""

from __future__ import annotations

import pytest
import torch

from effiformer.attention.sparse import SparseConfig, build_plan
from effiformer.ops.tiled_sparse import _backward_op, _decode, _forward_op, _plan, _structure


@pytest.mark.parametrize(
    "pattern, causal, padded",
    [("strided", True, False), ("fixed", False, True), ("strided", False, True)],
)
def test_the_registered_ops_pass_torch_library_opcheck(pattern, causal, padded):
    cfg = SparseConfig(pattern=pattern, stride=4, summary=1, num_verts=2)
    real = None
    if padded:
        real = torch.ones(1, 14, dtype=torch.bool)
        real[0, 12:] = False
    plan = build_plan(cfg, 2, 14, causal=causal, key_padding=real, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    tp = plan.padded_len
    q, k, v = (torch.randn(1, tp, 2, 3, dtype=torch.float64, generator=g) for _ in range(3))
    masks = [pc.mask for pc in plan.calls]
    empties = [pc.empty for pc in plan.calls]
    structure = _structure(plan)
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), masks, empties, structure)
    torch.library.opcheck(_forward_op, args)
    out, lse = (t.detach() for t in _forward_op(*args))
    grad = torch.randn_like(out)
    plain = [t.detach() for t in (q, k, v)]
    torch.library.opcheck(_backward_op, (grad, *plain, out, lse, masks, empties, structure))


def test_the_plan_survives_its_structure_string():
    cfg = SparseConfig(pattern="fixed", stride=8, summary=2, num_verts=2)
    plan = build_plan(cfg, 4, 40, causal=True)
    again = _plan(_structure(plan), [pc.mask for pc in plan.calls], [pc.empty for pc in plan.calls])
    assert [pc.call for pc in again.calls] == [pc.call for pc in plan.calls]
    assert (again.seq_len, again.padded_len, again.stride, again.summary, again.bases) == (
        plan.seq_len, plan.padded_len, plan.stride, plan.summary, plan.bases,
    )  # fmt: skip
    assert _decode(_structure(plan)) is _decode(_structure(plan))  # decoded once per plan
