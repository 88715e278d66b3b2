"""Lite Transformer configurations (Wu, Liu, Lin, Lin, Han, ICLR 2020, arXiv 2004.11886).

Lite Transformer is the encoder-decoder Transformer of :mod:`effiformer.models.seq2seq` with
two changes, so its models are configurations of the ``seq2seq`` family (no new family):

- sec. 3.1, "flattened" FFN: the feed-forward width equals the model width (``ffn_dim = dim``);
- sec. 3.2, LSRA: the self-attention of both stacks is
  :class:`~effiformer.attention.lsra.LSRAConfig` (half the channels to 4-head attention, half to a
  convolution of 4 kernel groups; kernel sizes 3, 7, 15, 31, 31, 31 by layer); the
  encoder-decoder attention stays dense and full width (8 heads WMT, 4 IWSLT: the
  ``decoder-attention-heads`` of the official architectures, our ``n_heads``).

Post-LN, sinusoidal positions, ReLU, label smoothing 0.1 (the official
``transformer_multibranch_v2`` defaults). Registered, from the official
``configs/*/attention/multibranch_v2/embed*.yml``:

- ``lite-iwslt-160`` / ``-240`` / ``-320`` (IWSLT'14 De-En): lightweight convolutions without
  GLU, DropConnect 0.1, dropout 0.2, no attention dropout; separate source, target and output
  embeddings (the IWSLT configs share none); a joint vocabulary of 10k (the BPE size of its
  ``prepare.sh``). Recipe :data:`~effiformer.recipes.LITE_IWSLT_RECIPE`.
- ``lite-wmt-200`` / ``-408`` / ``-496`` (WMT'14 En-De): dynamic convolutions with GLU, shared
  embeddings (``share-all-embeddings``), 32,768 joint BPE tokens; weight dropout (DropConnect)
  0.03 / 0.06 / 0.08, attention dropout 0.03 / 0.06 / 0.08 and dropout 0.04 / 0.08 / 0.1 by size.
  Recipe :data:`~effiformer.recipes.LITE_WMT_RECIPE` (the En-Fr configs differ in the warmup,
  5K, and at d 408 in the dropouts, 0.07; :data:`~effiformer.recipes.LITE_WMT_EN_FR_RECIPE`).
- ``lite-multi30k``: 3+3 layers of d 256 (kernels 3, 7, 15: the official list cut to the
  depth), lightweight, for Multi30k on a CPU beside ``transformer-multi30k``; ``lite-tiny``.

Paper figures these configurations reproduce (:mod:`effiformer.flops`, at 30 tokens, embeddings
and output projection excluded): WMT 90 / 360 / 527 M Mult-Adds and 2.9 / 11.7 / 17.3 M
parameters. The paper's IWSLT d 160 parameter count (2.8 M) does not follow from its config,
which gives 1.7 M without embeddings.

Deviation: the IWSLT architecture initialises the FFN with fairseq's ``ratio_xavier_uniform_``
(fan-out taken as twice the fan-in); the family's Xavier-uniform init is used here.
"""

from __future__ import annotations

from ..attention.lsra import LSRAConfig
from ..recipes import (
    LITE_IWSLT_DECODING,
    LITE_IWSLT_RECIPE,
    LITE_WMT_DECODING,
    LITE_WMT_RECIPE,
    register_model_decoding,
    register_model_recipe,
)
from ..registry import register_model
from .seq2seq import Seq2SeqConfig

__all__ = ["lite_config"]


def lite_config(
    dim: int,
    *,
    conv: str,
    glu: bool,
    weight_dropout: float,
    n_heads: int,
    n_layers: int = 6,
    **fields,
) -> Seq2SeqConfig:
    """A Lite Transformer ``seq2seq`` config of width ``dim``: flattened FFN (``ffn_dim=dim``)
    and LSRA self-attention (``conv``, ``glu``, ``weight_dropout``); ``n_heads`` are the
    encoder-decoder attention's heads; other fields pass to :class:`Seq2SeqConfig`."""
    attention = LSRAConfig(conv=conv, glu=glu, weight_dropout=weight_dropout)
    return Seq2SeqConfig(
        dim=dim,
        n_heads=n_heads,
        n_layers=n_layers,
        ffn_dim=dim,
        attention=attention,
        **fields,
    )


for _d in (160, 240, 320):
    register_model(
        f"lite-iwslt-{_d}",
        lite_config(
            _d,
            conv="lightweight",
            glu=False,
            weight_dropout=0.1,
            n_heads=4,
            vocab_size=10000,
            seq_len=1024,
            dropout=0.2,
            attn_dropout=0.0,
            share_embeddings=False,
            tie_output=False,
        ),
        f"Lite Transformer IWSLT'14 De-En, d {_d}: LSRA (lightweight conv), flattened FFN",
    )

for _d, _p in ((200, (0.03, 0.04)), (408, (0.06, 0.08)), (496, (0.08, 0.1))):
    register_model(
        f"lite-wmt-{_d}",
        lite_config(
            _d,
            conv="dynamic",
            glu=True,
            weight_dropout=_p[0],
            n_heads=8,
            vocab_size=32768,
            seq_len=1024,
            dropout=_p[1],
            attn_dropout=_p[0],
        ),
        f"Lite Transformer WMT'14 En-De, d {_d}: LSRA (dynamic conv + GLU), flattened FFN",
    )

register_model(
    "lite-multi30k",
    lite_config(
        256,
        conv="lightweight",
        glu=False,
        weight_dropout=0.1,
        n_heads=4,
        n_layers=3,
        vocab_size=8000,
        seq_len=128,
        dropout=0.1,
    ),
    "Lite Transformer 3+3 layers, d 256, lightweight LSRA: Multi30k on a CPU",
)
register_model(
    "lite-tiny",
    Seq2SeqConfig(
        vocab_size=256,
        dim=32,
        n_heads=2,
        n_layers=2,
        ffn_dim=32,
        seq_len=64,
        dropout=0.0,
        attention=LSRAConfig(conv="dynamic", glu=True, kernel_sizes=(3, 7)),
    ),
    "Lite Transformer 2+2 layers, d 32, dynamic LSRA: for tests",
)

register_model_recipe("lite-iwslt-*", LITE_IWSLT_RECIPE)
register_model_recipe("lite-wmt-*", LITE_WMT_RECIPE)
register_model_decoding("lite-iwslt-*", LITE_IWSLT_DECODING)
register_model_decoding("lite-wmt-*", LITE_WMT_DECODING)
