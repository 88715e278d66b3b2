"""Lite Transformer configurations in the seq2seq family: the paper's layout, incremental
decoding through LSRA layers, beam search, and the recipes."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model, get_config
from effiformer.attention.cross import CrossAttention
from effiformer.attention.lsra import LSRAAttention, LSRAConfig, LSRAState
from effiformer.generation import beam_search, greedy_search
from effiformer.recipes import (
    LITE_IWSLT_RECIPE,
    LITE_WMT_RECIPE,
    SEQ2SEQ_RECIPE,
    recipe_for,
)

PAD, BOS, EOS = 0, 2, 3


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _batch(seed=0, b=3, s=9, t=8, vocab=256):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(5, vocab, (b, s), generator=g)
    for i, n in enumerate([s, s - 3, 4][:b]):
        src[i, n - 1] = EOS
        src[i, n:] = PAD
    tgt = torch.randint(5, vocab, (b, t), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


def test_registered_configs_follow_the_official_ones():
    for d in (160, 240, 320):
        c = get_config(f"lite-iwslt-{d}")
        a = c.attention
        assert isinstance(a, LSRAConfig) and a.conv == "lightweight" and not a.glu
        assert (c.dim, c.ffn_dim, c.n_heads, c.n_layers, c.decoder_layers) == (d, d, 4, 6, 6)
        assert (c.dropout, c.attn_dropout, a.weight_dropout) == (0.2, 0.0, 0.1)
        assert not c.share_embeddings and not c.tie_output and not c.norm_first
    drops = {200: (0.03, 0.04), 408: (0.06, 0.08), 496: (0.08, 0.1)}
    for d, (wd, p) in drops.items():
        c = get_config(f"lite-wmt-{d}")
        a = c.attention
        assert a.conv == "dynamic" and a.glu and a.attention_fraction == 0.5
        assert (a.attn_heads, a.conv_heads, a.kernel_sizes) == (4, 4, (3, 7, 15, 31, 31, 31))
        assert (c.dim, c.ffn_dim, c.n_heads, c.vocab_size) == (d, d, 8, 32768)
        assert (a.weight_dropout, c.attn_dropout, c.dropout) == (wd, wd, p)
        assert c.share_embeddings and c.tie_output and not c.norm_first
        assert c.positions == "sinusoidal" and c.label_smoothing == 0.1


def test_built_model_splits_self_attention_only():
    m = create_model("lite-wmt-200", vocab_size=64)
    for stack in (m.encoder, m.decoder):
        kernels = [b.attn.conv.kernel_size for b in stack]
        assert kernels == [3, 7, 15, 31, 31, 31]
        for b in stack:
            assert isinstance(b.attn, LSRAAttention)
            assert b.attn.attn.dim == 100 and b.attn.attn.n_heads == 4
            assert b.attn.conv.dim == 100 and b.attn.conv.heads == 4
            assert b.attn.conv.linear1.out_features == 200  # GLU doubles, then halves
            assert b.ffn.fc1.out_features == 200  # flattened FFN
    for b in m.decoder:
        assert isinstance(b.cross_attn, CrossAttention)
        assert b.cross_attn.dim == 200 and b.cross_attn.n_heads == 8  # full width
    assert [b.attn.dims.causal for b in m.decoder] == [True] * 6
    assert [b.attn.dims.causal for b in m.encoder] == [False] * 6


def test_multi30k_size_cuts_the_kernel_list_to_its_depth():
    m = create_model("lite-multi30k", vocab_size=64)
    assert [b.attn.conv.kernel_size for b in m.encoder] == [3, 7, 15]
    assert [b.attn.conv.kernel_size for b in m.decoder] == [3, 7, 15]


@pytest.mark.parametrize("name", ["lite-tiny", "lite-multi30k"])
def test_incremental_decoding_equals_recomputing_the_prefix(name):
    torch.manual_seed(0)
    over = {"dim": 32, "n_heads": 4, "ffn_dim": 32} if name == "lite-multi30k" else {}
    m = create_model(name, vocab_size=256, **over).double().eval()
    src, tgt_in, _ = _batch()
    enc = m.encode(src)
    assert enc.mask is not None and not enc.mask.all()
    state = m.init_decoding_state(enc)
    assert all(isinstance(s.self_attn, LSRAState) for s in state.layers)
    steps = []
    for t in range(tgt_in.shape[1]):
        out = m.decode_step(tgt_in[:, t : t + 1], state)
        state = out.state
        steps.append(out.logits)
    full = m(src, tgt_in).logits
    assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    half = m.decode_step(tgt_in[:, :5], m.init_decoding_state(enc))
    rest = m.decode_step(tgt_in[:, 5:], half.state)
    assert_close(torch.cat([half.logits, rest.logits], 1), full, rtol=1e-10, atol=1e-10)


def test_greedy_search_equals_argmax_over_recomputed_prefixes():
    torch.manual_seed(0)
    m = create_model("lite-tiny").double().eval()
    src, _, _ = _batch(b=2)
    got = greedy_search(m, src, max_len_a=0, max_len_b=6)
    for i, hyp in enumerate(got):
        prefix = torch.tensor([[BOS]])
        tokens = []
        for _ in range(len(hyp.tokens)):
            logits = m(src[i : i + 1, : int((src[i] != PAD).sum())], prefix).logits[0, -1]
            logits[[PAD, BOS]] = -float("inf")
            nxt = int(logits.argmax())
            tokens.append(nxt)
            prefix = torch.cat([prefix, torch.tensor([[nxt]])], 1)
            if nxt == EOS:
                break
        assert hyp.tokens == [t for t in tokens if t != EOS]


def test_beam_search_runs_through_reordered_lsra_states():
    torch.manual_seed(0)
    m = create_model("lite-tiny").eval()
    src, _, _ = _batch(b=2)
    hyps = beam_search(m, src, beam=4, max_len_a=0, max_len_b=8, n_best=2)
    assert len(hyps) == 2 and all(len(h) == 2 for h in hyps)
    one = beam_search(m, src, beam=1, max_len_a=0, max_len_b=8)
    assert [h[0].tokens for h in one] == [
        h.tokens for h in greedy_search(m, src, max_len_a=0, max_len_b=8)
    ]


@pytest.mark.parametrize("attention", ["lightconv", "dynamicconv"])
def test_pay_less_attention_baseline_builds_in_the_seq2seq_family(attention):
    torch.manual_seed(0)
    m = create_model("seq2seq-tiny", attention={"name": attention, "kernel_sizes": (3, 5)})
    assert m.encoder[1].attn.conv.kernel_size == 5 and m.encoder[0].attn.attn is None
    src, tgt_in, tgt = _batch()
    out = m(src, tgt_in, targets=tgt)
    out.loss.backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def test_lite_recipes_are_looked_up_by_model_name_before_the_family():
    assert recipe_for("lite-wmt-408", "seq2seq") is LITE_WMT_RECIPE
    assert recipe_for("lite-iwslt-160", "seq2seq") is LITE_IWSLT_RECIPE
    assert recipe_for("lite-multi30k", "seq2seq") is SEQ2SEQ_RECIPE
    assert recipe_for(None, "seq2seq") is SEQ2SEQ_RECIPE
    r = LITE_WMT_RECIPE
    assert (r.optimizer, r.lr, r.betas, r.warmup, r.schedule, r.steps) == (
        "adam",
        1e-3,
        (0.9, 0.98),
        10_000,
        "cosine",
        50_000,
    )
    assert r.min_lr_ratio == pytest.approx(1e-4) and r.clip is None and r.weight_decay == 0
    i = LITE_IWSLT_RECIPE
    assert (i.lr, i.warmup, i.schedule, i.weight_decay) == (5e-4, 4000, "inverse_sqrt", 1e-4)
