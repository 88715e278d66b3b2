"""Funnel-Transformer model: block lengths, pool-query-only, [CLS] slot, one block = plain relative
encoder, decoder upsampling and residual, forms agree, heads and ELECTRA train, config checks."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from effiformer import ConfigError, create_model, get_config, list_models
from effiformer.attention.funnel_relative import FunnelPositions, rel_sinusoid, relative_distances
from effiformer.layers.pooling import pool_sequence
from effiformer.models.funnel import (
    FunnelConfig,
    FunnelElectra,
    FunnelForMaskedLM,
    FunnelForMultipleChoice,
    FunnelForQuestionAnswering,
    FunnelForSequenceClassification,
    FunnelForTokenClassification,
    FunnelModel,
)

TINY = dict(
    vocab_size=50, dim=32, n_heads=2, ffn_dim=64, seq_len=512, dropout=0.0, attn_dropout=0.0
)


def _cfg(**kw):
    return FunnelConfig(**{**TINY, "block_sizes": (1, 1, 1), **kw})


def _ids(b=2, t=16, seed=0):
    return torch.randint(0, 50, (b, t), generator=torch.Generator().manual_seed(seed))


def test_registered_names_and_shapes():
    names = list_models("funnel-*")
    for n in (
        "funnel-tiny",
        "funnel-b4-4-4",
        "funnel-b6-6-6",
        "funnel-b6-3x2-3x2",
        "funnel-b8-8-8",
        "funnel-b10-10-10",
    ):
        assert n in names
    c = get_config("funnel-b8-8-8")
    assert (c.dim, c.n_heads, c.head_dim, c.ffn_dim, c.vocab_size) == (1024, 16, 64, 4096, 30522)
    c = get_config("funnel-b6-3x2-3x2")
    assert c.block_sizes == (6, 3, 3) and c.block_repeats == (1, 2, 2) and c.n_layers == 18
    assert get_config("funnel-b4-4-4").seq_len == 512 and not get_config("funnel-b4-4-4").causal


@pytest.mark.parametrize("t, lengths", [(512, [512, 256, 128]), (9, [9, 5, 3])])
def test_block_lengths_and_decoder_restores_length(t, lengths):
    model = FunnelForMaskedLM(_cfg()).eval()
    ids = _ids(1, t)
    with torch.no_grad():
        enc = model.funnel.encode(ids)
        out = model(ids)
    assert enc.lengths == lengths
    assert out.logits.shape == (1, t, 50) and out.hidden.shape == (1, t, 32)


def test_pool_query_only_first_layer_of_block_two_and_cls_slot():
    model = FunnelModel(_cfg(block_sizes=(1, 2, 1))).eval()
    seen = []

    def hook(mod, args, kwargs, out):
        seen.append((args[0], kwargs.get("kv")))

    for layer in model.encoder.blocks[1]:
        layer.attn.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(_ids(2, 16))
    (q1, kv1), (q2, kv2) = seen
    assert q1.shape[1] == 8 and kv1.shape[1] == 16  # q half the length of k and v
    assert kv2 is None and q2.shape[1] == 8  # later layers attend at the pooled length
    assert_close(q1, pool_sequence(kv1, "mean"))  # the query is the pooled block-1 output
    assert_close(q1[:, 0], kv1[:, 0], rtol=0, atol=0)  # pooled slot 0 is the [CLS] state


def test_pool_qkv_together_ablation():
    model = FunnelModel(_cfg(pool_q_only=False)).eval()
    seen = []
    model.encoder.blocks[1][0].attn.register_forward_hook(
        lambda m, a, k, o: seen.append((a[0].shape[1], k.get("kv"))), with_kwargs=True
    )
    with torch.no_grad():
        base = model(_ids()).hidden
    assert seen == [(8, None)]
    ref = FunnelModel(_cfg()).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(base, ref(_ids()).hidden)


def _naive_layer(layer, x, t):
    """One post-LN layer written out: textbook scores, softmax, P V, residual LN, FFN, LN."""
    a = layer.attn
    pos = torch.arange(t)
    p = FunnelPositions(
        "relative_shift", rel=rel_sinusoid(relative_distances(pos, pos, 1), 32).to(x.dtype), shift=1
    )
    s = a.scores(x, positions=p)
    _, _, v = a._project(x, None)
    o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(x.shape[0], t, -1)
    x = layer.norm1(x + a.o_proj(o))
    return layer.norm2(x + layer.ffn.fc2(F.gelu(layer.ffn.fc1(x), approximate="tanh")))


def test_one_block_is_a_plain_relative_attention_encoder():
    torch.manual_seed(0)
    model = FunnelModel(_cfg(block_sizes=(3,), n_decoder_layers=0)).to(torch.float64).eval()
    ids = _ids(2, 12)
    got = model(ids).hidden
    enc = model.encoder
    x = enc.embed_norm(enc.embed(ids))
    for layer in enc.blocks[0]:
        x = _naive_layer(layer, x, 12)
    assert got.shape == (2, 12, 32)
    assert_close(got, x, rtol=1e-10, atol=1e-10)


def test_decoder_window_shares_upsampled_component_and_adds_block_one_output():
    model = FunnelModel(_cfg()).eval()
    ids = _ids(2, 16)  # lengths 16 -> 8 -> 4: [CLS] + 3 slots of 4 tokens, 3 truncated tokens
    seen = []
    model.decoder.layers[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        enc = model.encode(ids)
        model(ids)
    up = seen[0] - enc.first_block  # (B, T, D): the upsampled component
    assert_close(up[:, 0], enc.hidden[:, 0])  # [CLS] kept apart
    stride = enc.strides[-1]
    assert stride == 4
    for w in range(3):  # tokens 1..12 in windows of 4 share the final block's slot 1 + w
        win = up[:, 1 + stride * w : 1 + stride * (w + 1)]
        assert_close(win, enc.hidden[:, 1 + w, None].expand_as(win))
    assert (up[:, 13:] == 0).all()  # the truncated tail gets no upsampled component
    assert not torch.allclose(up[:, 1], up[:, 5])


def test_decoder_residual_is_last_layer_of_block_one_with_repeats():
    model = FunnelModel(_cfg(block_repeats=(2, 1, 1))).eval()
    outs = []
    model.encoder.blocks[0][0].register_forward_hook(lambda m, a, o: outs.append(o.out))
    with torch.no_grad():
        enc = model.encode(_ids())
    assert len(outs) == 2  # one layer applied twice (shared weights)
    assert_close(enc.first_block, outs[1], rtol=0, atol=0)
    assert not torch.allclose(enc.first_block, outs[0])


def test_shared_repeats_have_the_parameters_of_the_distinct_layers():
    a = FunnelModel(_cfg(block_sizes=(2, 1, 1), block_repeats=(1, 2, 2)))
    b = FunnelModel(_cfg(block_sizes=(2, 1, 1)))
    assert a.num_params() == b.num_params() and a.config.n_layers == 6


def test_factorized_model_equals_relative_shift_model_and_max_pooling_differs():
    torch.manual_seed(0)
    rs = FunnelForMaskedLM(_cfg()).to(torch.float64).eval()
    fa = FunnelForMaskedLM(_cfg(attention={"kind": "factorized"})).to(torch.float64).eval()
    fa.load_state_dict(rs.state_dict())
    ids = _ids(2, 19)
    tt = torch.zeros_like(ids)
    tt[:, 9:] = 1
    tt[:, 0] = 2
    a, b = rs(ids, token_type_ids=tt).logits, fa(ids, token_type_ids=tt).logits
    assert_close(a, b, rtol=1e-9, atol=1e-9)
    mx = FunnelForMaskedLM(_cfg(pooling="max")).to(torch.float64).eval()
    mx.load_state_dict(rs.state_dict())
    assert not torch.allclose(mx(ids, token_type_ids=tt).logits, a)


def test_pooled_padding_uses_the_official_polarity_inside_the_model():
    model = FunnelModel(_cfg()).eval()
    seen = []
    model.encoder.blocks[2][0].attn.register_forward_hook(
        lambda m, a, k, o: seen.append(k["mask"].key_padding), with_kwargs=True
    )
    mask = torch.ones(1, 16, dtype=torch.long)
    mask[0, 6:] = 0  # block 2 windows (1,2)(3,4)(5,6)...: (5,6) straddles -> kept
    with torch.no_grad():
        model(_ids(1, 16), attention_mask=mask)
    # block-2 keys (first layer of block 3 attends to them): [CLS], w12, w34, w56, w78, ...
    assert seen[0].tolist() == [[True, True, True, True, False, False, False, False]]


def test_mlm_loss_ignores_minus_100_and_backpropagates():
    model = FunnelForMaskedLM(_cfg(dropout=0.1, attn_dropout=0.1)).train()
    ids = _ids()
    targets = torch.full_like(ids, -100)
    targets[:, 3] = ids[:, 3]
    out = model(ids, targets=targets)
    ref = F.cross_entropy(out.logits[:, 3].float(), ids[:, 3])
    assert_close(out.loss, ref)
    out.loss.backward()
    assert model.funnel.encoder.embed.weight.grad.abs().sum() > 0
    assert model.head.decoder.weight is model.funnel.encoder.embed.weight  # tied


@pytest.mark.parametrize("kind", ["seq3", "regression", "token", "qa", "choice"])
def test_task_heads_give_losses_and_gradients(kind):
    torch.manual_seed(0)
    cfg, ids = _cfg(), _ids(2, 16)
    if kind == "seq3":
        model = FunnelForSequenceClassification(cfg, n_labels=3)
        out = model(ids, labels=torch.tensor([0, 2]))
        assert out.logits.shape == (2, 3) and model.funnel.decoder is None
    elif kind == "regression":
        model = FunnelForSequenceClassification(cfg, n_labels=1)
        out = model(ids, labels=torch.tensor([0.5, -1.0]))
        assert_close(out.loss, F.mse_loss(out.logits[:, 0], torch.tensor([0.5, -1.0])))
    elif kind == "token":
        model = FunnelForTokenClassification(cfg, n_labels=4)
        labels = torch.randint(0, 4, (2, 16))
        labels[:, 0] = -100
        out = model(ids, labels=labels)
        assert out.logits.shape == (2, 16, 4)
    elif kind == "qa":
        model = FunnelForQuestionAnswering(cfg)
        out = model(ids, start_positions=torch.tensor([3, 5]), end_positions=torch.tensor([4, 9]))
        assert out.logits.shape == (2, 16, 2)
    else:
        model = FunnelForMultipleChoice(cfg)
        out = model(_ids(6, 16).view(2, 3, 16), labels=torch.tensor([1, 2]))
        assert out.logits.shape == (2, 3)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        if kind == "choice" and name == "head.out.bias":
            # one bias added to every choice's score: the softmax over the choices does not
            # see it, so its gradient is zero in exact arithmetic (float32 leaves ~0 or 0)
            assert p.grad is not None and p.grad.abs().max() < 1e-6, name
        elif name.startswith("head.") or name.endswith("embed.weight"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_electra_samples_replacements_and_combines_losses():
    torch.manual_seed(0)
    disc = _cfg()
    gen = _cfg(dim=16, n_heads=1, ffn_dim=32)
    model = FunnelElectra(disc, gen).train()
    ids = _ids(2, 16)
    targets = torch.full_like(ids, -100)
    targets[:, [2, 5, 9]] = ids[:, [2, 5, 9]]
    masked_in = ids.clone()
    masked_in[:, [2, 5, 9]] = 0  # [MASK]
    out = model(masked_in, targets=targets, generator=torch.Generator().manual_seed(1))
    assert out.logits.shape == (2, 16)
    original = torch.where(targets != -100, targets, masked_in)
    assert torch.equal(out.replaced, out.corrupted != original)
    assert torch.equal(out.corrupted[targets == -100], masked_in[targets == -100])
    assert_close(out.loss, out.generator_loss + 50.0 * out.discriminator_loss)
    out.loss.backward()
    shared = model.discriminator.encoder.embed.weight
    assert model.gen_head.decoder.weight is shared
    assert shared.grad is not None and shared.grad.abs().sum() > 0
    assert model.disc_head.out.weight.grad.abs().sum() > 0
    assert model.generator.encoder.blocks[0][0].attn.q_proj.weight.grad.abs().sum() > 0


def test_config_validation_and_input_errors():
    with pytest.raises(ConfigError, match="causal"):
        _cfg(causal=True)
    with pytest.raises(ConfigError, match="block_repeats"):
        _cfg(block_repeats=(1, 2))
    with pytest.raises(ConfigError, match="attention.kind"):
        _cfg(attention={"kind": "rel"})
    assert _cfg(block_sizes=(2, 3), n_layers=99).n_layers == 5  # derived
    model = create_model("funnel-tiny")
    ids = _ids(1, 8)
    with pytest.raises(ValueError, match="token_type_ids"):
        model(ids, token_type_ids=torch.full_like(ids, 3))
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(1, 7))
    with pytest.raises(ValueError, match="vocabulary"):
        model(torch.full((1, 8), 5000))
