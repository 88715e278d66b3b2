"""The analytic parameter and Mult-Adds counts: HAT's README figures for every released
SubTransformer, the closed forms on the ten features, and torch's FLOP counter on real runs."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from effiformer import create_model
from effiformer.generation import beam_search
from effiformer.models.hat import (
    RELEASED_WMT14_ENDE,
    TINY_SPACE,
    WMT_SPACE,
    SubTransformer,
    export_subtransformer,
    sample_generator,
)
from effiformer.search.features import hat_features
from effiformer.search.macs import (
    decoding_macs,
    dense_as_subtransformer,
    features_decoding_macs,
    features_macs,
    subtransformer_macs,
    subtransformer_params,
)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", sorted(RELEASED_WMT14_ENDE))
def test_released_wmt14_subtransformers_reproduce_the_readme(name):
    """#Params (M) and FLOPs (G) without embeddings and output layer, at 30 tokens."""
    rec = RELEASED_WMT14_ENDE[name]
    params = subtransformer_params(rec["sub"], 512)
    flops = subtransformer_macs(rec["sub"], 512, src_len=30).flops
    assert round(params / 1e6, 2) == rec["params_m"]
    assert round(flops / 1e9, 2) == rec["gflops"]


def test_the_raspberry_pi_extremes():
    small = RELEASED_WMT14_ENDE["HAT_wmt14ende_raspberrypi@3.5s"]["sub"]
    big = RELEASED_WMT14_ENDE["HAT_wmt14ende_raspberrypi@6.9s"]["sub"]
    assert subtransformer_params(small, 512) == 25_217_536  # 25.22 M
    assert round(subtransformer_params(big, 512) / 1e6, 2) == 48.33
    assert round(subtransformer_macs(small, 512).flops / 1e9, 2) == 1.53
    assert round(subtransformer_macs(big, 512).flops / 1e9, 2) == 3.02
    # Without torchprofile's elementwise counts the 3.5 s model rounds to 1.52.
    assert round(subtransformer_macs(small, 512, elementwise=False).flops / 1e9, 2) == 1.52


IWSLT = {  # configs/iwslt14.de-en/subtransformer/HAT_iwslt14deen_titanxp@*.yml -> README
    "45.6ms": ([4, 4, 2, 4, 4, 4], [2048], [4], [4], [-1], 16.82, 0.78),
    "74.5ms": ([4] * 6, [2048, 1024], [4, 2], [4, 4], [-1, -1], 19.98, 0.93),
    "109.0ms": ([4] * 6, [1024, 1024, 2048], [4] * 3, [4] * 3, [2, -1, -1], 23.13, 1.13),
    "137.8ms": ([4] * 6, [1024, 2048, 2048, 1024], [4, 4, 4, 2], [4] * 4, [2, -1, -1, -1],
                27.33, 1.32),
    "168.8ms": ([4] * 6, [2048, 2048, 2048, 1024, 1024], [4, 4, 4, 2, 2], [4] * 5,
                [2, -1, -1, -1, -1], 31.54, 1.52),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(IWSLT))
def test_released_iwslt_subtransformers_at_23_tokens(name):
    heads_e, ffn_d, heads_d, cross, att, params_m, gflops = IWSLT[name]
    sub = SubTransformer.from_hat(
        {
            "encoder": {"encoder_embed_dim": 512, "encoder_layer_num": 6,
                        "encoder_ffn_embed_dim": [1024] * 6,
                        "encoder_self_attention_heads": heads_e},
            "decoder": {"decoder_embed_dim": 512, "decoder_layer_num": len(ffn_d),
                        "decoder_ffn_embed_dim": ffn_d, "decoder_self_attention_heads": heads_d,
                        "decoder_ende_attention_heads": cross,
                        "decoder_arbitrary_ende_attn": att},
        }
    )  # fmt: skip
    assert round(subtransformer_params(sub, 512) / 1e6, 2) == params_m
    assert round(subtransformer_macs(sub, 512, src_len=23).flops / 1e9, 2) == gflops


def test_feature_closed_forms_equal_the_per_layer_counts():
    for i in range(20):
        sub = WMT_SPACE.widened(ffn=(512,), heads=(2,)).sample(sample_generator(1, i))
        f = hat_features(sub)
        assert features_macs(f) == pytest.approx(subtransformer_macs(sub, 512).total, rel=1e-12)
        assert features_decoding_macs(f) == pytest.approx(decoding_macs(sub, 512).total, rel=1e-12)


def test_parameter_count_is_the_standalone_model_without_embeddings():
    torch.manual_seed(0)
    sup = create_model("hat-tiny")
    sub = TINY_SPACE.sample(sample_generator(0, 3))
    standalone = export_subtransformer(sup, sub)
    counted = sum(p.numel() for n, p in standalone.named_parameters() if "embed" not in n)
    assert counted == subtransformer_params(sub, TINY_SPACE.qkv_dim)


def _sdpa_cpu_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    # PyTorch has no formula for the CPU flash kernel; count it as its CUDA SDPA formulas do.
    return 2 * q[0] * q[1] * q[2] * k[2] * (q[3] + v[3])


def _counted_flops(fn) -> int:
    aten = torch.ops.aten
    extra = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu_flops
    with FlopCounterMode(display=False, custom_mapping=extra) as counter:
        fn()
    return counter.get_total_flops()


def test_mult_adds_match_torchs_flop_counter_on_real_runs():
    """Teacher forcing and beam-search decoding of a tiny SubTransformer: torch counts exactly
    twice the analytic matrix-product Mult-Adds (output layer included)."""
    torch.manual_seed(0)
    sup = create_model("hat-tiny").eval()
    sub = SubTransformer(
        encoder_dim=24, decoder_dim=32, encoder_layers=2, decoder_layers=2,
        encoder_ffn=(32, 64), encoder_heads=(2, 4), decoder_ffn=(64, 32), decoder_heads=(4, 2),
        cross_heads=(2, 4), attend=(2, 1),
    )  # fmt: skip
    q, v = TINY_SPACE.qkv_dim, sup.config.vocab_size
    src = torch.randint(4, v, (1, 7))
    src[0, -1] = 3
    tgt = torch.randint(4, v, (1, 7))
    with torch.no_grad():
        tf = _counted_flops(lambda: sup(src, tgt, sample=sub))
    want = subtransformer_macs(sub, q, src_len=7, elementwise=False, vocab=v)
    assert tf == 2 * want.total
    view = sup.bind(sub)
    dec = _counted_flops(
        lambda: beam_search(view, src, beam=3, max_len_a=0, max_len_b=5, min_len=5)
    )
    assert dec == 2 * decoding_macs(sub, q, src_len=7, steps=6, beam=3, vocab=v).total


def test_a_dense_seq2seq_config_is_a_subtransformer():
    from effiformer import get_config

    sub, qkv = dense_as_subtransformer(get_config("transformer-base"))
    assert qkv == 512 and sub.encoder_dim == 512 and sub.decoder_ffn == (2048,) * 6
    # Transformer-base without embeddings: 44.1M (6 x 3.15M + 6 x 4.20M).
    assert round(subtransformer_params(sub, qkv) / 1e6, 1) == 44.1
    with pytest.raises(ValueError, match="dense"):
        dense_as_subtransformer(get_config("transformer-base", attention="local"))
