"""The position-wise feed-forward network: the plain form and the gated GEGLU (Shazeer 2020),
checked against a hand computation, and the Routing Transformer's released configurations that
use it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from effiformer.layers.ffn import FeedForward


@pytest.mark.parametrize("name,approximate", [("geglu", "none"), ("geglu_tanh", "tanh")])
def test_geglu_is_gelu_of_one_half_times_the_other(name, approximate):
    torch.manual_seed(0)
    ffn = FeedForward(8, 6, activation=name, bias=False).double()
    assert ffn.fc1.weight.shape == (12, 8) and ffn.fc1.bias is None and ffn.fc2.bias is None
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    w, v = ffn.fc1.weight[:6], ffn.fc1.weight[6:]
    want = (F.gelu(x @ w.T, approximate=approximate) * (x @ v.T)) @ ffn.fc2.weight.T
    assert_close(ffn(x), want)
    plain = FeedForward(8, 6, activation="gelu").double()  # the ungated form is unchanged
    assert plain.fc1.weight.shape == (6, 8)
    assert_close(plain(x), plain.fc2(F.gelu(plain.fc1(x))))
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(8, 6, activation="swiglu")


def test_routing_release_configs_are_post_ln_geglu_without_ffn_biases():
    """Issue 23: tensor2tensor's basic_params1 (post-LN, sublayer and input dropout 0.1) and
    ``ffn_layer="geglu"`` (no biases, tanh GELU) in every released routing configuration."""
    from effiformer import create_model
    from effiformer.registry import get_config

    for name in ("routing-enwik8", "routing-wikitext103", "routing-pg19"):
        c = get_config(name)
        assert (c.norm_first, c.activation, c.ffn_bias, c.dropout) == (
            False, "geglu_tanh", False, 0.1
        )  # fmt: skip
    assert (get_config("routing-wikitext103").attn_dropout,
            get_config("routing-wikitext103").ffn_dropout) == (0.4, 0.4)  # fmt: skip
    small = create_model("routing-enwik8", n_layers=1, dim=32, n_heads=4, ffn_dim=48,
                         seq_len=512, **{"attention.window": 32,
                                         "attention.cluster_window": 32})  # fmt: skip
    ffn = small.blocks[0].ffn
    assert ffn.gated and ffn.fc1.weight.shape == (96, 32) and ffn.fc1.bias is None
    assert isinstance(small.final_norm, torch.nn.Identity)  # post-LN: no final norm
