"""The Sparse Transformer's model options in the vanilla family (Child et al. 2019, section 5):
GELU x sigmoid(1.702 x), factorized (row, column) positions, the initialisation, no dropout
inside the FFN, recomputation; and the named configurations."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model, get_config
from effiformer.config import ConfigError
from effiformer.layers.ffn import ACTIVATIONS, FeedForward
from effiformer.layers.positions import FactorizedPositions, build_positions


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_gelu_sigmoid_is_x_times_sigmoid_of_1702_x():
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    assert_close(ACTIVATIONS["gelu_sigmoid"](x), x / (1 + torch.exp(-1.702 * x)))
    # an approximation of the erf GELU, not the same function
    assert (ACTIVATIONS["gelu_sigmoid"](x) - torch.nn.functional.gelu(x)).abs().max() > 1e-3


def test_factorized_positions_add_a_row_and_a_column_embedding():
    pos = FactorizedPositions(8, max_len=50, stride=16)
    assert pos.rows.weight.shape == (4, 8) and pos.cols.weight.shape == (16, 8)
    x = torch.zeros(2, 50, 8)
    out = pos(x)
    for t in (0, 15, 16, 33, 49):
        assert_close(out[0, t], pos.rows.weight[t // 16] + pos.cols.weight[t % 16])
    assert_close(pos(x[:, :10], offset=20)[0], out[0, 20:30])
    with pytest.raises(ValueError, match="cover 50 tokens"):
        pos(torch.zeros(1, 51, 8))
    with pytest.raises(ValueError, match="stride"):
        build_positions("factorized", 8, 50)


def test_sparse_transformer_initialisation():
    model = create_model("sparse-tiny", n_layers=4)
    c = model.config
    params = dict(model.named_parameters())
    assert torch.count_nonzero(params["head.weight"]) == 0  # output logits start at 0
    assert params["head.weight"] is not params["embed.weight"]  # untied

    def std(name):
        return params[name].std().item()

    assert std("embed.weight") == pytest.approx(0.125 / math.sqrt(c.dim), rel=0.1)
    assert std("pos.rows.weight") == pytest.approx(0.125 / math.sqrt(2 * c.dim), rel=0.3)
    assert std("blocks.0.attn.q_proj.weight") == pytest.approx(0.125 / math.sqrt(c.dim), rel=0.1)
    scale = 1 / math.sqrt(2 * c.n_layers)
    assert std("blocks.1.attn.o_proj.weight") == pytest.approx(
        scale * 0.125 / math.sqrt(c.inner_dim), rel=0.1
    )
    assert std("blocks.2.ffn.fc2.weight") == pytest.approx(
        scale * 0.125 / math.sqrt(c.ffn_dim), rel=0.1
    )
    assert std("blocks.0.ffn.fc1.weight") == pytest.approx(0.125 / math.sqrt(c.dim), rel=0.1)
    assert torch.count_nonzero(params["blocks.0.ffn.fc1.bias"]) == 0
    ids = torch.randint(0, 256, (2, 20))
    assert_close(model(ids).logits, torch.zeros(2, 20, 256))  # uniform prediction at the start


def test_defaults_of_the_vanilla_family_are_unchanged():
    c = get_config("vanilla-small")
    assert (c.positions, c.init, c.activation, c.tie_embeddings, c.ffn_dropout) == (
        "learned",
        "gpt2",
        "gelu",
        True,
        None,
    )
    m = create_model("vanilla-tiny", dropout=0.3)
    assert m.blocks[0].ffn.drop.p == 0.3


def test_the_sparse_block_drops_out_only_at_the_residuals():
    m = create_model("sparse-tiny", dropout=0.4)
    assert m.blocks[0].ffn.drop.p == 0.0 and m.blocks[0].drop.p == 0.4
    assert isinstance(m.blocks[0].ffn, FeedForward) and m.config.norm_first


def test_bad_model_options_fail_clearly():
    with pytest.raises(ConfigError, match="position_stride"):
        create_model("vanilla-tiny", positions="factorized")
    with pytest.raises(ConfigError, match="tie_embeddings"):
        create_model("vanilla-tiny", init="sparse_transformer")
    with pytest.raises(ValueError, match="init"):
        create_model("vanilla-tiny", init="xavier")
    with pytest.raises(ConfigError, match="ffn_dropout"):
        create_model("vanilla-tiny", ffn_dropout=1.5)


def test_named_configurations_follow_the_paper():
    c = get_config("sparse-enwik8")
    a = c.attention
    assert (c.n_layers, c.dim, c.n_heads, c.seq_len, c.dropout) == (30, 512, 8, 12288, 0.4)
    assert (a.pattern, a.stride, a.summary, a.combine) == ("fixed", 128, 32, "merged")
    assert (c.positions, c.position_stride, c.init, c.activation) == (
        "factorized",
        128,
        "sparse_transformer",
        "gelu_sigmoid",
    )
    assert c.recompute and c.norm_first and c.ffn_dim == 4 * c.dim
    with torch.device("meta"):
        n = sum(p.numel() for p in create_model("sparse-enwik8").parameters())
    assert 94e6 < n < 96e6  # the paper's 95M


def test_a_sparse_model_trains():
    torch.manual_seed(0)
    model = create_model("sparse-tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 16, (4, 65))
    losses = []
    for _ in range(15):
        out = model(x[:, :-1], targets=x[:, 1:])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.75 * losses[0]
