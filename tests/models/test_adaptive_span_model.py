"""The Adaptive Attention Span model: the ``xl`` family with ``attention=adaptive_span`` and the
options that make it the official ``TransformerSeq`` (unscaled untied embeddings, dropout on the
FFN and the attention weights only, PyTorch's default init), and the named configurations."""

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from effiformer import create_model, get_config
from effiformer.attention.adaptive_span import AdaptiveSpanConfig
from effiformer.config import ConfigError
from effiformer.models.transformer_xl import RUNTIME_FIELDS


@pytest.mark.parametrize(
    "name,layers,dim,ffn,heads,block,span,lam,dropout",
    [
        # experiments/enwik8_small.sh, enwik8.sh (text8.sh: the same model), enwik8_large.sh
        ("adaptive-span-small", 8, 256, 1024, 4, 256, 1024, 2e-6, 0.0),
        ("adaptive-span-base", 12, 512, 2048, 8, 512, 8192, 5e-7, 0.3),
        ("adaptive-span-large", 24, 768, 4096, 8, 512, 8192, 5e-7, 0.4),
    ],
)
def test_named_configurations_are_the_official_scripts(
    name, layers, dim, ffn, heads, block, span, lam, dropout
):
    c = get_config(name)
    assert (c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.seq_len) == (layers, dim, ffn, heads, block)
    assert isinstance(c.attention, AdaptiveSpanConfig)
    a = c.attention
    assert (a.max_span, a.ramp, a.init_span, a.penalty, a.adapt_cache) == (
        span, 32, 0.0, lam, True,
    )  # fmt: skip
    assert c.mem_len == span and c.dropout == dropout and c.attn_dropout == dropout
    assert not c.tie_embeddings and not c.embed_scale and c.init == "torch"
    assert c.emb_dropout == 0.0 and c.residual_dropout == 0.0 and not c.norm_first


def test_dropout_sits_on_the_ffn_and_the_attention_weights_only():
    model = create_model("adaptive-span-base", n_layers=1, mem_len=64)
    block = model.blocks[0]
    assert block.ffn.drop.p == 0.3 and block.attn.dropout == 0.3
    assert block.drop.p == 0.0 and model.drop.p == 0.0
    xl = create_model("xl-tiny", dropout=0.2)  # the Transformer-XL default: everywhere
    assert xl.blocks[0].drop.p == 0.2 and xl.drop.p == 0.2
    assert {"emb_dropout", "residual_dropout"} <= RUNTIME_FIELDS


def test_embeddings_unscaled_and_pytorch_default_init():
    torch.manual_seed(0)
    model = create_model("adaptive-span-small", n_layers=2, mem_len=64)
    assert model.embed.scale == 1.0
    emb = model.embed.emb_layers[0].weight
    assert 0.9 < float(emb.detach().std()) < 1.1  # nn.Embedding's N(0, 1)
    ids = torch.randint(0, 256, (1, 5))
    assert_close(model.embed(ids), emb[ids])
    w = model.blocks[0].attn.q_proj.weight  # nn.Linear's kaiming-uniform: U(+-1/sqrt(fan_in))
    assert float(w.detach().abs().max()) <= 1 / math.sqrt(256) + 1e-6
    assert 0.8 < float(w.detach().std()) * math.sqrt(3 * 256) < 1.2
    out = model.softmax.weights[0]  # untied, nn.Linear-like
    assert out is not emb and float(out.detach().abs().max()) <= 1 / math.sqrt(256) + 1e-6
    # The Transformer-XL defaults are unchanged.
    xl = create_model("xl-tiny")
    assert xl.embed.scale == 8.0 and xl.config.init == "xl"
    assert 0.015 < float(xl.blocks[0].attn.q_proj.weight.detach().std()) < 0.025


def test_part_initialised_parameters_survive_the_xl_init():
    torch.manual_seed(0)
    model = create_model(
        "xl-tiny", attention={"name": "adaptive_span", "max_span": 64, "init_span": 0.5}
    )
    assert model.config.init == "xl"
    pe = dict(model.named_parameters())["blocks.shared.g0.key_pe"]
    assert 0.8 < float(pe.detach().std()) < 1.2
    assert model.blocks[0].attn.current_val.tolist() == [0.5, 0.5]
    assert 0.015 < float(model.blocks[0].attn.q_proj.weight.detach().std()) < 0.025


def test_bad_xl_options_name_the_field():
    with pytest.raises(ConfigError, match="init"):
        get_config("xl-tiny", init="kaiming")
    with pytest.raises(ConfigError, match="emb_dropout"):
        get_config("xl-tiny", emb_dropout=1.5)
    with pytest.raises(ConfigError, match="residual_dropout"):
        get_config("xl-tiny", residual_dropout=-0.1)


def test_tiny_model_trains_and_streams():
    torch.manual_seed(0)
    model = create_model("adaptive-span-tiny")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(0))
    state = None
    for seg in range(3):
        x = ids[:, seg * 32 : (seg + 1) * 32]
        out = model(x, targets=x, state=state)
        opt.zero_grad()
        out.total_loss.backward()
        opt.step()
        state = out.state
    assert all(isinstance(t, torch.Tensor) and not t.requires_grad for t in state)
    assert isinstance(model.blocks[0].attn.q_proj, nn.Linear)
