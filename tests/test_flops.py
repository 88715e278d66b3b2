"""The analytic Mult-Adds counter and parameter count reproduce the papers' figures."""

from __future__ import annotations

import pytest

from effiformer import create_model, get_config
from effiformer.attention.lsra import LSRAConfig
from effiformer.flops import (
    MultAdds,
    count_parameters,
    cross_attention_mult_adds,
    format_mult_adds,
    mult_adds,
    seq2seq_mult_adds,
)
from effiformer.models.seq2seq import Seq2SeqConfig


@pytest.mark.parametrize(
    "name,paper",
    [("lite-wmt-200", 90e6), ("lite-wmt-408", 360e6), ("lite-wmt-496", 527e6)],
)
def test_lite_wmt_mult_adds_match_the_paper(name, paper):
    m = seq2seq_mult_adds(get_config(name))
    assert m.src_len == m.tgt_len == 30
    assert abs(m.total - paper) / paper < 0.005, m.total


def test_transformer_base_mult_adds_match_the_paper():
    m = seq2seq_mult_adds(get_config("transformer-base"))
    assert abs(m.total - 1335e6) / 1335e6 < 0.005, m.total
    assert m.total == 1_337_794_560  # 30 tokens, full 30 x 30 scores in the decoder too


@pytest.mark.parametrize(
    "name,paper",
    [("lite-wmt-200", 2.9e6), ("lite-wmt-408", 11.7e6), ("lite-wmt-496", 17.3e6)],
)
def test_lite_wmt_parameters_without_embeddings_match_the_paper(name, paper):
    model = create_model(name, vocab_size=16, n_layers=6)  # embeddings are not counted
    assert round(count_parameters(model) / 1e5) == round(paper / 1e5)


def test_iwslt_160_parameters_are_what_its_config_gives():
    """The paper lists 2.8 M; the released config (d 160, flattened FFN) has 1.7 M."""
    model = create_model("lite-iwslt-160", vocab_size=16)
    assert 1.70e6 < count_parameters(model) < 1.72e6


def _lite_layer_params(d, k, *, glu, dynamic, decoder, cross_heads_inner=None):
    """Module-shape arithmetic of one Lite layer (weights and biases, LayerNorms included)."""
    c = d // 2
    attn = 4 * c * c + 4 * c
    conv = c * (2 * c if glu else c) + (2 * c if glu else c) + c * c + c
    conv += c * 4 * k if dynamic else 4 * k
    ffn = 2 * d * d + 2 * d
    norms = (3 if decoder else 2) * 2 * d
    cross = (4 * d * d + 4 * d) if decoder else 0
    return attn + conv + ffn + norms + cross


@pytest.mark.parametrize("name", ["lite-wmt-200", "lite-iwslt-240", "lite-multi30k"])
def test_parameter_counts_match_module_shape_arithmetic(name):
    c = get_config(name)
    a = c.attention
    want = 0
    for dec, n in ((False, c.n_layers), (True, c.decoder_layers)):
        for i in range(n):
            k = a.for_layer(i, n).kernel_size
            want += _lite_layer_params(
                c.dim, k, glu=a.glu, dynamic=a.conv == "dynamic", decoder=dec
            )
    model = create_model(name, vocab_size=16)
    assert count_parameters(model) == want
    embeddings = 16 * c.dim * (1 if c.share_embeddings else 2) + (0 if c.tie_output else 16 * c.dim)
    assert count_parameters(model, embeddings=True) == want + embeddings


def test_a_toy_seq2seq_config_equals_a_hand_count():
    """d 8, one layer each, n 5, K 3, dynamic conv with GLU, 2 cross-attention heads."""
    n, d, k = 5, 8, 3
    c = d // 2
    config = Seq2SeqConfig(
        vocab_size=32, dim=d, n_heads=2, n_layers=1, ffn_dim=d, seq_len=16,
        attention=LSRAConfig(conv="dynamic", glu=True, kernel_sizes=(k,)),
    )  # fmt: skip
    lsra = 4 * n * c * c + 2 * n * n * c + 3 * n * c * c + n * c * 4 * k
    ffn = 2 * n * d * d
    cross = 4 * n * d * d + 2 * n * n * d
    m = seq2seq_mult_adds(config, src_len=n)
    assert m.parts == {
        "encoder.self_attention": lsra,
        "encoder.ffn": ffn,
        "decoder.self_attention": lsra,
        "decoder.cross_attention": cross,
        "decoder.ffn": ffn,
    }
    assert m.total == 2 * lsra + 2 * ffn + cross and m.encoder == lsra + ffn
    taps = seq2seq_mult_adds(config, src_len=n, taps=True)
    assert taps.total == m.total + 2 * n * c * k
    other = seq2seq_mult_adds(config, src_len=n, tgt_len=7)
    assert other.parts["decoder.cross_attention"] == cross_attention_mult_adds(d, 2, 4, 7, n)


def test_unknown_counts_are_none_and_formatting():
    assert mult_adds(get_config("vanilla-small")) is None  # not a translation model
    routing = get_config("seq2seq-tiny", attention={"name": "local", "window": 8})
    assert seq2seq_mult_adds(routing) is None  # the part does not count itself
    assert format_mult_adds(None) == "-"
    assert format_mult_adds(526_990_080) == "527M"
    assert format_mult_adds(1_337_794_560) == "1.34G"
    assert format_mult_adds(MultAdds(total=975_360, src_len=30, tgt_len=30)) == "1.0M"
    with pytest.raises(ValueError, match="src_len"):
        seq2seq_mult_adds(get_config("lite-tiny"), src_len=0)


def test_list_shows_mult_adds_of_translation_models(capsys):
    from effiformer.cli import main

    assert main(["list", "lite-wmt-*"]) == 0
    out = capsys.readouterr().out
    assert "527M" in out and "90M" in out
    assert main(["list", "vanilla-tiny"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["#", "name", "family", "params", "madds"]
    # parameters (on the meta device), then no Mult-Adds: an empty column
    assert line.split()[:4] == ["vanilla-tiny", "vanilla", "125K", "2"]
