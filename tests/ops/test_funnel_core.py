"""Funnel's relative attention core as registered operators (``effiformer::funnel_core_forward``
and ``_backward``): torch.library's own consistency checks (fake implementation, autograd
registration, schema), and the whole Funnel model under ``torch.export`` (issue 24: the core
wrote into ``out=`` buffers inside an autograd function, which export refused)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model
from effiformer.ops.funnel_core import _backward_op, _forward_op

F64 = torch.float64


def _inputs(seed, b=1, h=2, tq=6, tk=6, dh=4, nf=2, shift=1, grad=True):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, tq, dh), (b, h, tk, dh), (b, h, tk, dh), (b, h, tq, nf), (b, h, tk, nf),
              (b, h, tq), (b, 1, 1, tk), (h, tk + shift * tq, dh), (h, dh)]  # fmt: skip
    out = [torch.randn(*s, dtype=F64, generator=g) for s in shapes]
    for i, t in enumerate(out):
        t.requires_grad_(grad and i != 6)  # the padding bias has no gradient
    return out


@pytest.mark.parametrize("row0, p", [(True, 0.0), (False, 0.0), (True, 0.3)])
def test_the_registered_ops_pass_torch_library_opcheck(row0, p):
    qu, k, v, qf, kf, c0, kb, r, pb = _inputs(0)
    args = (qu, k, v, qf, kf, c0, kb, r, pb, row0, 1, p, 1234)
    torch.library.opcheck(_forward_op, args)
    none = (None,) * 6
    torch.library.opcheck(_forward_op, (qu, k, v, *none, False, 1, 0.0, 0))
    out = _forward_op(*args).detach()
    grad = torch.randn_like(out)
    plain = [t.detach() for t in (qu, k, v, qf, kf, c0, kb, r, pb)]
    torch.library.opcheck(_backward_op, (grad, *plain, out, row0, 1, p, 1234, True))


def test_funnel_exports_and_gives_the_eager_output():
    torch.manual_seed(0)
    model = create_model("funnel-tiny").eval()
    ids = torch.randint(5, 50, (2, 32), generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, (ids,))
    names = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "effiformer.funnel_core_forward.default" in names  # one opaque op, not its insides
    with torch.no_grad():
        want = model(ids)
    got = program.module()(ids)
    assert_close(got.hidden, want.hidden, rtol=0, atol=0)
    other = torch.randint(5, 50, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close(program.module()(other).hidden, model(other).hidden, rtol=0, atol=0)


def test_the_export_command_writes_a_funnel_program_for_its_length(tmp_path):
    """``effiformer export`` of a Funnel model: its length is part of its structure (pooled
    lengths are integers), so the program takes any batch at ``seq_len`` tokens, and says so."""
    import json

    from effiformer import save_model
    from effiformer.export import export_run, program_length

    torch.manual_seed(0)
    model = create_model("funnel-tiny").eval()
    save_model(model, tmp_path / "m")
    info = export_run(tmp_path / "m", tmp_path / "out")
    L = model.config.seq_len
    assert info["fixed_length"] == L and info["inputs"] == [f"ids (batch, {L})"]
    assert info["max_abs_diff"] == 0.0
    assert json.loads((tmp_path / "out" / "export.json").read_text())["fixed_length"] == L
    prog = torch.export.load(str(tmp_path / "out" / "model.pt2"))
    assert program_length(prog) == L
    ids = torch.randint(5, 50, (5, L), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close(prog.module()(ids), model(ids).logits, rtol=0, atol=0)
