"""HAT's ten architecture features of a SubTransformer (official ``utils.get_config_features``).

``encoder_embed_dim, encoder_layer_num, encoder_ffn_embed_dim_avg,
encoder_self_attention_heads_avg, decoder_embed_dim, decoder_layer_num,
decoder_ffn_embed_dim_avg, decoder_self_attention_heads_avg, decoder_ende_attention_heads_avg,
decoder_arbitrary_ende_attn_avg``: averages over the **active** layers only; the last is the mean
number of encoder layers each decoder layer attends to (1-3; the official code maps its codes
-1 / 1 / 2 to 1 / 2 / 3 here). These are the first ten columns of HAT's latency files and the
latency predictor's input.
"""

from __future__ import annotations

from statistics import fmean

from ..models.hat import DesignSpace, SubTransformer

__all__ = [
    "FEATURE_NAMES",
    "HAT_FEATURE_NORM",
    "HAT_LATENCY_NORM",
    "LATENCY_COLUMNS",
    "hat_features",
    "space_feature_norm",
]

FEATURE_NAMES = (
    "encoder_embed_dim",
    "encoder_layer_num",
    "encoder_ffn_embed_dim_avg",
    "encoder_self_attention_heads_avg",
    "decoder_embed_dim",
    "decoder_layer_num",
    "decoder_ffn_embed_dim_avg",
    "decoder_self_attention_heads_avg",
    "decoder_ende_attention_heads_avg",
    "decoder_arbitrary_ende_attn_avg",
)
#: The latency columns of HAT's files, in ms (the predictor's target is encoder + decoder).
LATENCY_COLUMNS = (
    "latency_mean_encoder",
    "latency_mean_decoder",
    "latency_std_encoder",
    "latency_std_decoder",
)
#: ``feature-norm`` of every official ``configs/*/latency_predictor/*.yml``.
HAT_FEATURE_NORM = (640.0, 6.0, 2048.0, 6.0, 640.0, 6.0, 2048.0, 6.0, 6.0, 2.0)
#: ``lat-norm`` (ms) of the official WMT'14 En-De predictor configs, by device.
HAT_LATENCY_NORM = {"raspberrypi": 5000.0, "xeon": 300.0, "titanxp": 200.0}


def hat_features(sub: SubTransformer) -> list[float]:
    """The ten features of ``sub`` (inactive layers are ignored)."""
    t = sub.trimmed()
    return [
        float(t.encoder_dim),
        float(t.encoder_layers),
        fmean(t.encoder_ffn),
        fmean(t.encoder_heads),
        float(t.decoder_dim),
        float(t.decoder_layers),
        fmean(t.decoder_ffn),
        fmean(t.decoder_heads),
        fmean(t.cross_heads),
        fmean(t.attend),
    ]


def space_feature_norm(space: DesignSpace) -> tuple[float, ...]:
    """Feature scales for a space of any size, in the spirit of :data:`HAT_FEATURE_NORM`: the
    largest value each feature takes in ``space`` (HAT's WMT norms are round numbers of the
    same order)."""
    heads = float(max((*space.encoder_heads, *space.decoder_heads, *space.cross_heads)))
    ffn = float(max((*space.encoder_ffn, *space.decoder_ffn)))
    return (
        float(space.max_encoder_dim),
        float(space.max_encoder_layers),
        ffn,
        heads,
        float(space.max_decoder_dim),
        float(space.max_decoder_layers),
        ffn,
        heads,
        heads,
        float(max(space.attend)),
    )
