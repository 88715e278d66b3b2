"""HAT's SuperTransformer: front-slice weight sharing, arbitrary encoder-decoder attention, the
sample as an explicit argument, standalone export, incremental decoding and beam search."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from effiformer import create_model, get_config, load_model, save_model
from effiformer.attention import AttentionMask
from effiformer.attention.sinusoid import sinusoid_table
from effiformer.config import ConfigError
from effiformer.generation import beam_search
from effiformer.models.hat import (
    LATENCY_SPACES,
    RELEASED_WMT14_ENDE,
    TINY_SPACE,
    WMT_SPACE,
    HATConfig,
    HATEncoderOutput,
    SlicedLinear,
    SubTransformer,
    SuperTransformer,
    export_subtransformer,
    get_space,
    latency_space,
    sample_generator,
)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


SRC = torch.tensor([[17, 42, 99, 51, 3], [8, 77, 3, 0, 0]])  # EOS (3)-terminated, right-padded
TGT = torch.tensor([[25, 61, 9, 3], [77, 3, 0, 0]])


def _model(**over) -> SuperTransformer:
    torch.manual_seed(0)
    return create_model("hat-tiny", **over).eval()


def _sub(**over) -> SubTransformer:
    base = dict(
        encoder_dim=24, decoder_dim=32, encoder_layers=2, decoder_layers=1,
        encoder_ffn=(32, 64), encoder_heads=(2, 4), decoder_ffn=(32, 64),
        decoder_heads=(4, 2), cross_heads=(2, 4), attend=(2, 1),
    )  # fmt: skip
    base.update(over)
    return SubTransformer(**base)


def test_sliced_linear_is_the_front_slice_of_its_weight():
    torch.manual_seed(0)
    lin = SlicedLinear(8, 12)
    x = torch.randn(3, 5, 6)
    assert_close(lin(x, 7), F.linear(x, lin.weight[:7, :6], lin.bias[:7]), rtol=0, atol=0)
    assert_close(lin(torch.randn(2, 8)).shape, torch.Size([2, 12]))
    with pytest.raises(ValueError, match="does not fit"):
        lin(torch.randn(2, 9))


def test_backward_leaves_exactly_zero_gradient_outside_the_slices():
    model = _model().train()
    sub = _sub()  # decoder depth 1 of 2: the second decoder layer is identity
    out = model(SRC, targets=TGT, sample=sub)
    out.loss.backward()
    standalone = export_subtransformer(model, sub)
    shapes = {n: p.shape for n, p in standalone.named_parameters()}
    seen_inside = 0
    for name, p in model.named_parameters():
        if name not in shapes:  # a layer past the sampled depth
            assert name.startswith("decoder.1."), name
            assert p.grad is None, name
            continue
        inside = tuple(slice(0, n) for n in shapes[name])
        g = p.grad.clone()
        seen_inside += int(bool(g[inside].abs().sum() > 0))
        g[inside] = 0
        assert torch.equal(g, torch.zeros_like(g)), f"{name}: gradient outside its slice"
    assert seen_inside > 0.8 * len(shapes)  # the slices themselves do get gradients


def test_qkv_width_stays_fixed_so_heads_change_the_head_size():
    model = _model()
    q = TINY_SPACE.qkv_dim
    layer = model.encoder[0]
    assert layer.attn.qkv.weight.shape == (3 * q, 32) and layer.attn.out.weight.shape == (32, q)
    a = model(SRC, TGT, sample=_sub(encoder_heads=(4, 4))).logits
    b = model(SRC, TGT, sample=_sub(encoder_heads=(2, 4))).logits
    assert not torch.allclose(a, b)
    # Manual head-size-8 attention of the first layer equals the part's.
    x = torch.randn(1, 5, 24)
    out, _ = layer.attn(x, 2, AttentionMask())
    qkv = F.linear(x, layer.attn.qkv.weight[:, :24], layer.attn.qkv.bias)
    qq, kk, vv = (t.view(1, 5, 2, 8).transpose(1, 2) for t in qkv.split(q, -1))
    att = torch.softmax(qq @ kk.transpose(-1, -2) / math.sqrt(8), -1) @ vv
    ref = F.linear(
        att.transpose(1, 2).reshape(1, 5, q), layer.attn.out.weight[:24], layer.attn.out.bias[:24]
    )
    assert_close(out, ref)


def test_embedding_scale_positions_and_dropout_follow_the_sampled_width():
    model = _model()
    ids = torch.tensor([[5, 6, 7]])
    x = model._embed(model.src_embed, ids, 24, 0, 0)
    ref = model.src_embed.weight[ids, :24] * math.sqrt(24)
    ref = ref + sinusoid_table(torch.arange(3), 32)[:, :24]  # the first 24 of the 32-wide table
    assert_close(x, ref)
    m = create_model("hat-wmt-super", n_layers=1, vocab_size=64, seq_len=16)
    assert m._dropouts(512, 0) == pytest.approx((0.3 * 512 / 640, 0.0))
    assert m._dropouts(640, 1) == pytest.approx((0.3, 0.0))


def test_the_largest_subtransformer_is_a_plain_dense_transformer():
    """At the largest widths (attending to the last encoder layer) the SuperTransformer computes
    exactly what the seq2seq family's dense Transformer computes with the same weights."""
    model = _model()
    sub = TINY_SPACE.largest(attend=1)
    torch.manual_seed(1)
    dense = create_model(
        "seq2seq-tiny", dim=32, n_heads=4, head_dim=4, n_layers=2, decoder_layers=2, ffn_dim=64,
        dropout=0.0, attn_dropout=0.0,
    ).eval()  # fmt: skip
    q = TINY_SPACE.qkv_dim
    with torch.no_grad():
        dense.embed.weight.copy_(model.embed.weight)
        for e, h in zip(dense.encoder, model.encoder):
            for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
                getattr(e.attn, name).weight.copy_(h.attn.qkv.weight[i * q : (i + 1) * q])
                getattr(e.attn, name).bias.copy_(h.attn.qkv.bias[i * q : (i + 1) * q])
            e.attn.o_proj.load_state_dict(h.attn.out.state_dict())
            e.norm1.load_state_dict(h.norm1.state_dict())
            e.norm2.load_state_dict(h.norm2.state_dict())
            e.ffn.fc1.load_state_dict(h.fc1.state_dict())
            e.ffn.fc2.load_state_dict(h.fc2.state_dict())
        for e, h in zip(dense.decoder, model.decoder):
            for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
                getattr(e.attn, name).weight.copy_(h.attn.qkv.weight[i * q : (i + 1) * q])
                getattr(e.attn, name).bias.copy_(h.attn.qkv.bias[i * q : (i + 1) * q])
            e.attn.o_proj.load_state_dict(h.attn.out.state_dict())
            e.cross_attn.q_proj.load_state_dict(h.cross.q.state_dict())
            e.cross_attn.k_proj.weight.copy_(h.cross.kv.weight[:q])
            e.cross_attn.k_proj.bias.copy_(h.cross.kv.bias[:q])
            e.cross_attn.v_proj.weight.copy_(h.cross.kv.weight[q:])
            e.cross_attn.v_proj.bias.copy_(h.cross.kv.bias[q:])
            e.cross_attn.o_proj.load_state_dict(h.cross.out.state_dict())
            for n in ("norm1", "norm2", "norm3"):
                getattr(e, n).load_state_dict(getattr(h, n).state_dict())
            e.ffn.fc1.load_state_dict(h.fc1.state_dict())
            e.ffn.fc2.load_state_dict(h.fc2.state_dict())
    a = model(SRC, targets=TGT, sample=sub)
    b = dense(SRC, targets=TGT)
    assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
    # sample=None is the largest SubTransformer (attending to the last two here).
    assert_close(model(SRC, TGT).logits, model(SRC, TGT, sample=TINY_SPACE.largest()).logits)


def _enc(model, states, mask, sub):
    return HATEncoderOutput(states=tuple(states), mask=mask, sample=sub)


def test_arbitrary_attention_tiles_keys_and_mask():
    model = _model()
    sub = _sub(decoder_layers=2, attend=(2, 1))
    enc = model.encode(SRC, sample=sub)
    mem, mask = enc.memory(2)
    s = SRC.shape[1]
    assert mem.shape == (2, 2 * s, 24) and mask.shape == (2, 2 * s)
    assert torch.equal(mem[:, :s], enc.states[-1]) and torch.equal(mem[:, s:], enc.states[-2])
    assert torch.equal(mask, torch.cat([SRC != 0, SRC != 0], dim=1))
    state = model.init_decoding_state(enc, rows_per_sentence=3)
    assert state.layers[0].cross.k.shape == (2, 2, 2 * s, 8)  # (B, H, m S, Dh): 2 heads of 8
    assert state.layers[1].cross.k.shape == (2, 4, s, 4)
    assert torch.equal(state.layers[0].cross_mask, mask)
    with pytest.raises(ValueError, match="cannot attend to 3"):
        enc.memory(3)


def test_attending_to_two_identical_layers_equals_attending_to_one():
    """Duplicated keys cancel in the softmax: with the last two encoder outputs identical, the
    last two equal the last one (padding masked in both copies)."""
    model = _model()
    torch.manual_seed(3)
    h = torch.randn(2, SRC.shape[1], 24)
    mask = SRC != 0
    one, two = _sub(attend=(1, 1)), _sub(attend=(2, 2))
    a = model.decode(TGT, _enc(model, (h, h), mask, one)).logits
    b = model.decode(TGT, _enc(model, (h, h), mask, two)).logits
    assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Fidelity: the second-last layer is really attended to with attend=2 (and not with 1), and
    # its padding positions are masked.
    h2 = h.clone()
    h2[0, 1] += 1.0
    assert torch.equal(model.decode(TGT, _enc(model, (h2, h), mask, one)).logits, a)
    assert not torch.allclose(model.decode(TGT, _enc(model, (h2, h), mask, two)).logits, b)
    h3 = h.clone()
    h3[1, 3:] += 5.0  # padding of row 1 in the second-last layer
    assert_close(model.decode(TGT, _enc(model, (h3, h), mask, two)).logits, b)


def test_sample_is_an_explicit_argument_and_leaves_no_state():
    model = _model()
    before = model(SRC, TGT).logits
    model(SRC, TGT, sample=_sub())
    assert torch.equal(model(SRC, TGT).logits, before)
    assert model.bind(_sub()).sample == _sub()
    with pytest.raises(ValueError, match="does not fit"):
        model(SRC, TGT, sample=_sub(encoder_dim=40))
    with pytest.raises(ValueError, match="do not divide"):
        model(SRC, TGT, sample=_sub(encoder_heads=(3, 3)))


def test_exported_subtransformer_equals_the_supertransformer_with_that_sample(tmp_path):
    model = _model(dropout=0.2)
    sub = _sub()
    standalone = export_subtransformer(model, sub)
    assert standalone.config.sub == sub.trimmed()
    assert standalone.num_params() < model.num_params()
    assert_close(standalone(SRC, targets=TGT).logits, model(SRC, targets=TGT, sample=sub).logits)
    # Training mode too: the same dropout rescaling, the same RNG draws.
    model.train()
    standalone.train()
    torch.manual_seed(5)
    a = model(SRC, targets=TGT, sample=sub).loss
    torch.manual_seed(5)
    b = standalone(SRC, targets=TGT).loss
    assert_close(a, b)
    # A checkpoint of only its slices, reloaded through the registry.
    save_model(standalone, tmp_path / "sub")
    loaded = load_model(tmp_path / "sub").eval()
    model.eval()
    assert loaded.config == standalone.config
    assert_close(loaded(SRC, targets=TGT).logits, model(SRC, targets=TGT, sample=sub).logits)
    fresh = create_model("hat-tiny", sub=sub)  # the same architecture, new weights
    assert {n: p.shape for n, p in fresh.named_parameters()} == {
        n: p.shape for n, p in loaded.named_parameters()
    }


def test_incremental_decoding_equals_teacher_forcing_and_beam_search_runs():
    model = _model()
    sub = _sub(decoder_layers=2, attend=(2, 1))
    tin = torch.tensor([[2, 25, 61, 9], [2, 77, 5, 6]])
    full = model(SRC, tin, sample=sub).logits
    enc = model.encode(SRC, sample=sub)
    state = model.init_decoding_state(enc)
    steps = []
    for t in range(tin.shape[1]):
        out = model.decode_step(tin[:, t : t + 1], state)
        state = out.state
        steps.append(out.logits)
    assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert state.length == 4 and state.sample == sub
    view = model.bind(sub)
    found = beam_search(view, SRC, beam=3, max_len_a=0, max_len_b=4)
    standalone = export_subtransformer(model, sub).eval()
    again = beam_search(standalone, SRC, beam=3, max_len_a=0, max_len_b=4)
    assert [f[0].tokens for f in found] == [f[0].tokens for f in again]
    with pytest.raises(ValueError, match="across sentences"):
        model.reorder_decoding_state(model.init_decoding_state(enc, rows_per_sentence=2),
                                     torch.tensor([0, 2, 2, 3]))  # fmt: skip


def test_config_round_trips_space_and_sub_through_json(tmp_path):
    cfg = get_config("hat-tiny", sub=_sub())
    assert cfg.space == TINY_SPACE and cfg.sub == _sub().trimmed()
    assert (cfg.dim, cfg.n_heads, cfg.n_layers, cfg.ffn_dim) == (32, 4, 2, 64)
    m = create_model("hat-tiny", sub=_sub())
    save_model(m, tmp_path / "m")
    assert load_model(tmp_path / "m").config == cfg
    assert HATConfig(space=TINY_SPACE.to_dict()).space == TINY_SPACE
    with pytest.raises(ConfigError, match="exceed"):
        HATConfig(space="tiny", sub=_sub(encoder_dim=64))
    with pytest.raises(ConfigError, match="unknown design space"):
        HATConfig(space="nope")
    with pytest.raises(ConfigError, match="attend"):
        _sub(attend=(3, 1))


def test_design_spaces_are_the_papers():
    assert WMT_SPACE.max_encoder_dim == 640 and WMT_SPACE.qkv_dim == 512
    assert WMT_SPACE.encoder_layers == (6,) and WMT_SPACE.decoder_layers == (6, 5, 4, 3, 2, 1)
    assert WMT_SPACE.size() == 417_846_678_672_384  # ~0.42e15 (official issue #10)
    wide = LATENCY_SPACES["wmt"]
    assert wide.encoder_ffn == (3072, 2048, 1024, 512) and wide.encoder_heads == (8, 4, 2)
    assert get_space("iwslt").decoder_ffn == (2048, 1024, 512)
    assert latency_space(get_space("multi30k")) == LATENCY_SPACES["multi30k"]
    for name, rec in RELEASED_WMT14_ENDE.items():
        assert LATENCY_SPACES["wmt"].contains(rec["sub"]) and WMT_SPACE.contains(rec["sub"]), name


def test_genes_round_trip_and_inactive_slots_are_ignored():
    g = sample_generator(0, 7)
    sub = WMT_SPACE.sample(g)
    gene = WMT_SPACE.to_gene(sub)
    assert len(gene) == len(WMT_SPACE.gene_choices()) == 2 + 12 + 2 + 24
    assert WMT_SPACE.from_gene(gene).trimmed() == sub.trimmed()
    padded = dataclasses.replace(sub, decoder_ffn=sub.decoder_ffn + (1,) * 3)
    assert padded.trimmed() == sub.trimmed()
    assert sample_generator(3, 9).initial_seed() == sample_generator(3, 9).initial_seed()
    assert sample_generator(3, 9).initial_seed() != sample_generator(3, 10).initial_seed()


def test_sampled_choices_pass_a_chi_squared_uniformity_test():
    """1,500 draws of the WMT space: every gene (the widths, the decoder depth, every layer
    slot's FFN width, heads and attended layers) takes each of its choices uniformly
    (chi-squared, p > 1e-3), and two genes are independent (FFN widths of layers 0 and 1)."""
    from scipy.stats import chi2_contingency, chisquare

    draws = [WMT_SPACE.sample(sample_generator(0, i)) for i in range(1500)]
    for field in ("encoder_dim", "decoder_dim", "decoder_layers"):
        opts = getattr(WMT_SPACE, field)
        counts = [sum(getattr(s, field) == o for s in draws) for o in opts]
        assert chisquare(counts).pvalue > 1e-3, (field, counts)
    per_layer = ("encoder_ffn", "encoder_heads", "decoder_ffn", "decoder_heads", "cross_heads",
                 "attend")  # fmt: skip
    for field in per_layer:
        opts = getattr(WMT_SPACE, field)
        for layer in range(6):  # every slot is drawn, used by the sample or not
            counts = [sum(getattr(s, field)[layer] == o for s in draws) for o in opts]
            assert chisquare(counts).pvalue > 1e-3, (field, layer, counts)
    ffn = WMT_SPACE.encoder_ffn
    table = [[sum(s.encoder_ffn[:2] == (a, b) for s in draws) for b in ffn] for a in ffn]
    assert chi2_contingency(table).pvalue > 1e-3
