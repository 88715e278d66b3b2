"""``torch.compile`` over the registry: the families that must trace as one graph do (zero graph
breaks by ``torch._dynamo.explain``, forward and loss), and a compiled model's forward and
backward equal eager. The compiled comparison uses the ``aot_eager`` backend (dynamo and
AOTAutograd trace forward and backward, no code generation: seconds, not the ~25 s a shape
inductor takes on this CPU); the kernels behind the graphs are the same eager ones.
Families with breaks that remain are listed, with why, in docs/design.md ("Compile")."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import effiformer

#: name, config overrides: the families docs/design.md promises one graph for
ONE_GRAPH = [
    ("vanilla-tiny", {}),
    ("vanilla-tiny", {"attention": {"name": "local", "window": 16}}),
    ("vanilla-tiny", {"attention": {"name": "sparse", "pattern": "strided", "stride": 8}}),
    ("sparse-tiny", {}),
    ("vanilla-tiny", {"attention": {"name": "lsra"}}),
    ("xl-tiny", {}),
    ("compressive-tiny", {}),
    ("seq2seq-tiny", {}),
    ("lite-tiny", {}),
    ("routing-tiny", {}),
    ("hat-tiny", {}),
    ("funnel-tiny", {}),
]
IDS = [n + ("-" + o["attention"]["name"] if o else "") for n, o in ONE_GRAPH]


def _inputs(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = model.config.vocab_size
    if hasattr(model, "funnel"):  # a bidirectional encoder under the MLM head
        ids = torch.randint(5, v, (2, 16), generator=g)
        return (ids,), {"targets": ids}
    if hasattr(model.config, "pad_id"):  # encoder-decoder: source and targets, a padded row
        src = torch.randint(4, v, (2, 12), generator=g)
        src[1, 9:] = model.config.pad_id
        return (src,), {"targets": torch.randint(4, v, (2, 10), generator=g)}
    t = min(48, model.config.seq_len)  # one segment of the recurrent families
    ids = torch.randint(0, v, (2, t + 1), generator=g)
    return (ids[:, :-1],), {"targets": ids[:, 1:]}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(("name", "over"), ONE_GRAPH, ids=IDS)
def test_one_graph_no_break(name, over):
    torch.manual_seed(0)
    model = effiformer.create_model(name, **over).train()
    args, kw = _inputs(model)
    ex = torch._dynamo.explain(model)(*args, **kw)
    reasons = [str(b.reason).splitlines()[0] for b in ex.break_reasons]
    assert ex.graph_break_count == 0 and ex.graph_count == 1, reasons


@pytest.mark.parametrize(("name", "over"), ONE_GRAPH, ids=IDS)
def test_compiled_forward_and_backward_equal_eager(name, over):
    torch.manual_seed(0)
    model = effiformer.create_model(name, dropout=0.0, **over).train()
    args, kw = _inputs(model, seed=1)
    out = model(*args, **kw)
    out.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(*args, **kw)
    got.loss.backward()
    assert_close(got.logits, out.logits, rtol=1e-5, atol=1e-5)
    assert_close(got.loss, out.loss, rtol=1e-6, atol=1e-6)
    for n, p in model.named_parameters():
        if n in want:
            assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=n)


#: families that still break the graph (docs/design.md lists each break and why): compiled
#: piecewise, their outputs and gradients must still equal eager
WITH_BREAKS = ["adaptive-span-tiny"]


@pytest.mark.parametrize("name", WITH_BREAKS)
def test_families_with_breaks_compile_piecewise_to_the_eager_result(name):
    torch.manual_seed(0)
    model = effiformer.create_model(name, dropout=0.0).train()
    args, kw = _inputs(model, seed=1)
    out = model(*args, **kw)
    out.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    got = torch.compile(model, backend="aot_eager")(*args, **kw)
    got.loss.backward()
    assert_close(got.loss, out.loss, rtol=1e-6, atol=1e-6)
    for n, p in model.named_parameters():
        if n in want:
            assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=n)
