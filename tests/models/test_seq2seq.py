"""The encoder-decoder Transformer: incremental decoding equals recomputing the prefix, causality
of the decoder, source padding, the cached cross-attention memory, label smoothing, configs."""

import math

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model
from effiformer.config import ConfigError
from effiformer.layers.decoder_block import DecoderLayerState
from effiformer.models.seq2seq import DecodingState, label_smoothed_nll, shift_right

PAD, BOS, EOS = 0, 2, 3


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model(norm_first=False, **over):
    torch.manual_seed(0)
    m = create_model("seq2seq-tiny", norm_first=norm_first, **over).double().eval()
    return m


def _batch(seed=0, b=3, s=9, t=7, vocab=256):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(5, vocab, (b, s), generator=g)
    lengths = [s, s - 3, 4][:b]
    for i, n in enumerate(lengths):  # EOS-terminated, right-padded rows of different lengths
        src[i, n - 1] = EOS
        src[i, n:] = PAD
    tgt = torch.randint(5, vocab, (b, t), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_incremental_decoding_equals_recomputing_the_prefix(norm_first):
    m = _model(norm_first)
    src, tgt_in, _ = _batch()
    enc = m.encode(src)
    assert enc.mask is not None and not enc.mask.all()  # the batch really has source padding
    state = m.init_decoding_state(enc)
    for t in range(tgt_in.shape[1]):
        out = m.decode_step(tgt_in[:, t : t + 1], state)
        state = out.state
        full = m(src, tgt_in[:, : t + 1]).logits  # the whole prefix, recomputed
        assert_close(out.logits[:, 0], full[:, -1], rtol=1e-10, atol=1e-10)
    assert state.length == tgt_in.shape[1]
    # Every layer's self-attention cache holds the whole prefix.
    assert all(s.self_attn.length == tgt_in.shape[1] for s in state.layers)
    # Several tokens at once continue the same state.
    half = m.decode_step(tgt_in[:, :4], m.init_decoding_state(enc))
    rest = m.decode_step(tgt_in[:, 4:], half.state)
    assert_close(
        torch.cat([half.logits, rest.logits], 1), m(src, tgt_in).logits, rtol=1e-10, atol=1e-10
    )


def test_rows_per_sentence_share_the_memory_and_equal_repeated_sentences():
    m = _model()
    src, tgt_in, _ = _batch()
    g = 2
    enc = m.encode(src)
    state = m.init_decoding_state(enc, rows_per_sentence=g)
    assert state.layers[0].cross.k.shape[0] == src.shape[0]  # one memory per sentence
    rows = tgt_in.repeat_interleave(g, dim=0)
    rows[1::2] = torch.roll(rows[1::2], 1, dims=0)  # the second row of each sentence differs
    out = m.decode_step(rows, state)
    ref = m(src.repeat_interleave(g, dim=0), rows).logits
    assert_close(out.logits, ref, rtol=1e-10, atol=1e-10)


def test_the_encoder_memory_is_projected_once_per_sentence():
    m = _model()
    src, tgt_in, _ = _batch()
    calls = []
    for block in m.decoder:
        block.cross_attn.k_proj.register_forward_hook(lambda mod, i, o: calls.append(i[0].shape))
    enc = m.encode(src)
    state = m.init_decoding_state(enc, rows_per_sentence=4)
    assert len(calls) == len(m.decoder) and all(c[0] == src.shape[0] for c in calls)
    for t in range(3):
        state = m.decode_step(tgt_in[:, t : t + 1].repeat_interleave(4, 0), state).state
    assert len(calls) == len(m.decoder)  # no decoding step projected the memory again
    for block, layer in zip(m.decoder, state.layers):
        assert isinstance(layer, DecoderLayerState)
        ref = block.cross_attn.project_memory(enc.hidden)
        assert_close(layer.cross.k, ref.k, rtol=0, atol=0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_a_future_target_token_never_changes_earlier_decoder_outputs(norm_first):
    m = _model(norm_first)
    src, tgt_in, _ = _batch()
    base = m(src, tgt_in).logits
    for k in range(1, tgt_in.shape[1]):
        poked = tgt_in.clone()
        poked[:, k] = (poked[:, k] + 17) % 250 + 5
        out = m(src, poked).logits
        assert_close(out[:, :k], base[:, :k], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(out[:, k], base[:, k])


def test_source_padding_does_not_change_the_output():
    m = _model()
    src, tgt_in, _ = _batch()
    batched = m(src, tgt_in).logits
    enc = m.encode(src)
    for i in range(src.shape[0]):
        n = int((src[i] != PAD).sum())
        alone = m(src[i : i + 1, :n], tgt_in[i : i + 1]).logits
        assert_close(batched[i : i + 1], alone, rtol=1e-10, atol=1e-10)
        alone_enc = m.encode(src[i : i + 1, :n]).hidden
        assert_close(enc.hidden[i, :n], alone_enc[0], rtol=1e-10, atol=1e-10)
    # The padding tokens' ids do not matter either: only the mask does.
    other = src.clone()
    other[src == PAD] = 7
    out = m(other, tgt_in, src_mask=src != PAD).logits
    assert_close(out, batched, rtol=1e-10, atol=1e-10)


def test_label_smoothing_matches_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    v, eps = 6, 0.1
    logits = torch.randn(2, 3, v, generator=g, dtype=torch.float64)
    targets = torch.tensor([[1, 4, PAD], [5, -100, 2]])
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            y = int(targets[b, t])
            if y in (PAD, -100):
                continue
            logp = torch.log_softmax(logits[b, t], -1).tolist()
            # fairseq: 1 - eps on the gold token, eps / (V - 1) on each other token
            total += -(1 - eps) * logp[y] - sum(eps / (v - 1) * logp[j] for j in range(v) if j != y)
            count += 1
    loss, nll = label_smoothed_nll(logits, targets, eps, ignore=(-100, PAD), with_nll=True)
    assert math.isclose(float(loss), total / count, rel_tol=1e-6)
    hand_nll = -sum(
        float(torch.log_softmax(logits[b, t], -1)[int(targets[b, t])])
        for b, t in [(0, 0), (0, 1), (1, 0), (1, 2)]
    )
    assert math.isclose(float(nll), hand_nll / 4, rel_tol=1e-6)
    assert label_smoothed_nll(logits, targets, eps, ignore=(-100, PAD))[1] is None


def test_the_model_loss_is_label_smoothed_and_ignores_padding():
    m = _model(label_smoothing=0.1)
    src, tgt_in, tgt = _batch()
    tgt[0, -2:] = PAD
    out = m(src, tgt_in, targets=tgt)
    ref, _ = label_smoothed_nll(out.logits, tgt, 0.1, ignore=(PAD, -100))
    assert_close(out.loss, ref)
    # The pre-shifted decoder input can be left to the model.
    assert_close(m(src, targets=tgt).logits, m(src, shift_right(tgt, BOS, PAD)).logits)


def test_shared_embeddings_and_tied_output_projection():
    m = create_model("seq2seq-tiny")
    assert m.src_embed is m.embed and m.head.weight is m.embed.weight
    assert torch.equal(m.embed.weight[PAD], torch.zeros(m.config.dim))
    m2 = create_model("seq2seq-tiny", share_embeddings=False, tie_output=False)
    assert m2.src_embed is not m2.embed and m2.head.weight is not m2.embed.weight


def test_reorder_picks_rows_and_refuses_moves_across_sentences():
    m = _model()
    src, tgt_in, _ = _batch()
    enc = m.encode(src)
    state = m.init_decoding_state(enc, rows_per_sentence=2)
    rows = tgt_in.repeat_interleave(2, 0)
    rows[1::2, 1:] = 9
    state = m.decode_step(rows[:, :3], state).state
    index = torch.tensor([1, 1, 2, 3, 5, 4])
    moved = m.reorder_decoding_state(state, index)
    a = m.decode_step(rows[index, 3:4], moved).logits
    ref = m(src.repeat_interleave(2, 0), rows[index, :4]).logits[:, -1:]
    assert_close(a, ref, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="across sentences"):
        m.reorder_decoding_state(state, torch.tensor([2, 1, 2, 3, 4, 5]))


def test_attention_is_chosen_by_config_for_encoder_and_decoder():
    m = create_model(
        "seq2seq-tiny",
        attention={"name": "local", "window": 4},
        decoder_attention="dense",
    )
    assert type(m.encoder[0].attn).__name__ == "LocalAttention"
    assert type(m.decoder[0].attn).__name__ == "DenseAttention"
    src, tgt_in, tgt = _batch()
    out = m(src[:, :8], tgt_in, targets=tgt)
    assert math.isfinite(out.loss.item())
    m = create_model("seq2seq-tiny", decoder_attention={"name": "local", "window": 4})
    assert type(m.decoder[0].attn).__name__ == "LocalAttention"
    assert m.config.attention.name == "dense"
    with pytest.raises(NotImplementedError, match="incremental decoding"):
        m.init_decoding_state(m.encode(src))


def test_bad_configs_and_inputs_get_clear_errors():
    with pytest.raises(ConfigError, match="causal"):
        create_model("seq2seq-tiny", causal=False)
    with pytest.raises(ConfigError, match="must differ"):
        create_model("seq2seq-tiny", eos_id=2)
    with pytest.raises(ConfigError, match="decoder_layers"):
        create_model("seq2seq-tiny", decoder_layers=0)
    m = create_model("seq2seq-tiny", decoder_layers=1)
    assert len(m.encoder) == 2 and len(m.decoder) == 1
    src, tgt_in, _ = _batch()
    with pytest.raises(ValueError, match="src_ids: sequence length 70"):
        m(torch.full((1, 70), 5), tgt_in[:1])
    with pytest.raises(ValueError, match="tgt_in"):
        m(src, tgt_in[:2])
    with pytest.raises(ValueError, match="teacher forcing"):
        m(src, tgt_in, state=object())
    with pytest.raises(ValueError, match="at least one real token"):
        m(torch.zeros(1, 3, dtype=torch.long), tgt_in[:1])
    state = m.init_decoding_state(m.encode(src))
    assert isinstance(state, DecodingState)
    with pytest.raises(ValueError, match="rows"):
        m.decode_step(tgt_in[:2, :1], state)
