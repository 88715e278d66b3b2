"""LSH attention's chunked kernel as registered operators (``effiformer::lsh_chunked_forward`` and
``_backward``): torch.library's consistency checks (fake implementations, autograd registration,
schema) on layouts with and without padding, the duplicate correction and dropout, and what it
changed for ``torch.compile`` (issue 24: the kernel's strided window views broke the graph)."""

from __future__ import annotations

import pytest
import torch

from effiformer import create_model
from effiformer.ops.lsh_chunked import (
    _backward_op,
    _forward_op,
    _layout_args,
    _rows,
    chunked_layout,
)

F64 = torch.float64


def _layout(b, h, t, n_hashes, chunk, *, causal, real=None, dup=False, after=0, seed=0):
    """A layout from random permutations (one per round), as the sort hands it over."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.empty(b, h, n_hashes * t, dtype=torch.long)
    slots = torch.empty(b, h, n_hashes, t, dtype=torch.long)
    for i in range(b):
        for j in range(h):
            for r in range(n_hashes):
                perm = torch.randperm(t, generator=g)
                positions[i, j, r * t : (r + 1) * t] = perm
                slots[i, j, r, perm] = r * t + torch.arange(t)
    return chunked_layout(positions, slots, chunk, causal=causal, real=real,
                          n_chunks_after=after, duplicate_correction=dup)  # fmt: skip


@pytest.mark.parametrize(
    "causal, padded, dup, after, p, fused",
    [(True, False, False, 0, 0.0, False), (False, True, True, 1, 0.0, False),
     (True, False, False, 0, 0.2, False), (True, False, False, 0, 0.0, True)],
)  # fmt: skip
def test_the_registered_ops_pass_torch_library_opcheck(causal, padded, dup, after, p, fused):
    b, h, t, dh, n_hashes, chunk = 1, 2, 16, 4, 2, 4
    real = None
    if padded:
        real = torch.ones(b, t, dtype=torch.bool)
        real[0, -3:] = False
    lay = _layout(b, h, t, n_hashes, chunk, causal=causal, real=real, dup=dup, after=after)
    dtype = torch.float32 if fused else F64  # the CPU flash kernel takes float32
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, t, dh, generator=g, dtype=dtype) for _ in range(3))
    args = (_rows(q).requires_grad_(), _rows(k).requires_grad_(), _rows(v).requires_grad_(),
            *_layout_args(lay), p, 123, p > 0, fused)  # fmt: skip
    torch.library.opcheck(_forward_op, args)
    o, lse, norm = (x.detach() for x in _forward_op(*args))
    grad = torch.randn_like(o)
    plain = [a.detach() for a in args[:3]]
    torch.library.opcheck(_backward_op, (grad, *plain, o, lse, norm, *args[3:]))


def test_reformer_breaks_left_are_the_reversible_seed_draw():
    """Training forward of ``reformer-tiny`` under ``torch._dynamo.explain``: every break
    reason left is the reversible stack's draw of per-layer dropout seeds as Python ints
    (``layers/reversible.py``), which its backward replays; none is in the LSH kernel."""
    model = create_model("reformer-tiny").train()
    ids = torch.randint(0, 50, (2, 64), generator=torch.Generator().manual_seed(0))
    ex = torch._dynamo.explain(lambda x: model(x, targets=x).loss)(ids)
    frames = {(f.filename.rsplit("/", 1)[-1], f.name) for b in ex.break_reasons
              for f in b.user_stack[-1:]}  # fmt: skip
    assert ex.break_reasons and frames == {("reversible.py", "forward")}
    assert all("Data dependent" in str(b.reason) for b in ex.break_reasons)
