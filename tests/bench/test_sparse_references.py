"""The `local-attention` reference row (effiformer.bench.sparse_references)."""

from __future__ import annotations

import pytest
import torch

from effiformer.bench import sparse_references
from effiformer.bench.references import CellSpec, list_references
from effiformer.registry import get_config


def _spec(name, t=96, **over):
    return CellSpec(
        name=name,
        config=get_config(name, seq_len=max(t, 128), **over),
        part="attention",
        seq_len=t,
        batch=1,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def test_the_row_is_registered_beside_sparse_and_local_attention():
    ref = next(r for r in list_references() if r.name == "local-attention")
    assert ref.target == "*" and ref.attention == ("sparse", "local")
    assert ref.parts == ("attention",)
    assert ref.requires == ("local_attention",)


def test_window_is_the_sparse_stride_else_256():
    assert sparse_references.local_attention_window(_spec("sparse-tiny")) == 16
    assert sparse_references.local_attention_window(_spec("vanilla-tiny")) == 256


def test_workload_runs_forward_and_backward():
    pytest.importorskip("local_attention")
    wl = sparse_references.local_attention_reference(_spec("sparse-tiny"))
    out = wl.forward()
    assert out.shape == (1, 96, 64)
    wl.step_loss(out).backward()
    assert wl.inputs[0].grad is not None and wl.params_with_grad() > 0


def test_causal_windows_do_not_see_the_future():
    pytest.importorskip("local_attention")
    torch.manual_seed(0)
    layer = sparse_references.LocalAttentionLayer(16, 2, 8, window=8, causal=True).eval()
    x = torch.randn(1, 32, 16)
    x2 = x.clone()
    x2[:, 20:] += 1
    a, b = layer(x), layer(x2)
    assert torch.allclose(a[:, :20], b[:, :20], atol=1e-6)
    # look-back 1: position 19 is outside the windows position 8 sees
    x3 = x.clone()
    x3[:, 0] += 1
    assert torch.allclose(layer(x3)[:, 16:], a[:, 16:], atol=1e-6)
