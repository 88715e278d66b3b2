"""``--part attention`` times the model's first attention call, captured by hooks (no bench code on
the models): it must be exactly the layer the model runs, for every family built on the attention
interface."""

import pytest
import torch

from effiformer import create_model, list_models
from effiformer.attention.base import AttentionMask
from effiformer.bench.cell import NoAttentionCall, capture_attention_call

TINY = [n for n in list_models() if n.endswith("-tiny") and n != "hat-tiny"]


def _call(name: str, t: int = 32):
    torch.manual_seed(0)
    model = create_model(name).train()
    t = min(t, model.config.seq_len)
    return model, capture_attention_call(model, 2, t, "cpu", torch.float32)


def test_dense_call_is_block_zero_attention():
    model, call = _call("vanilla-tiny")
    assert call.module is model.blocks[0].attn
    out = call.forward()
    ref = model.blocks[0].attn(call.x, mask=AttentionMask(causal=True)).out
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert out.shape == call.x.shape == (2, 32, model.config.dim)


def test_memory_keys_end_with_the_new_hidden_states():
    """XL: the keys are memory ++ segment; the segment is the new x, so the backward reaches x
    through the keys as well as through the queries."""
    _, call = _call("xl-tiny")
    assert call.info["kv_ends_with_x"] and call.info["model_state"] == "full_memory"
    kv = call.kwargs["kv"]
    assert kv.shape[1] > call.x.shape[1]  # a full memory before the segment
    call.forward().sum().backward()
    both = call.x.grad.clone()
    call.x.grad = None
    frozen = dict(call.kwargs)
    frozen["kv"] = torch.cat([kv[:, : kv.shape[1] - call.x.shape[1]], call.x.detach()], dim=1)
    call.module(call.x, **frozen).out.sum().backward()
    assert not torch.allclose(both, call.x.grad)  # the keys' share of the gradient is there


def test_prepare_runs_in_every_call():
    """A part whose positions come from ``prepare`` (LSH's rotations) prepares in every call,
    as once per forward in the model: two calls draw different rotations."""
    _, call = _call("reformer-tiny", 64)
    assert call.info["prepare_per_call"]
    with torch.no_grad():
        a, b = call.forward(), call.forward()
    assert not torch.equal(a, b)


@pytest.mark.parametrize("name", TINY)
def test_every_family_has_a_first_attention_call(name):
    model, call = _call(name)
    out = call.forward()
    assert out.shape == call.x.shape
    out.float().sum().backward()
    assert call.x.grad is not None and torch.isfinite(call.x.grad).all()
    assert call.x.grad.abs().sum() > 0


def test_a_model_without_the_attention_interface_has_none():
    with pytest.raises(NoAttentionCall, match="no attention part"):
        capture_attention_call(create_model("hat-tiny"), 1, 8, "cpu", torch.float32)
