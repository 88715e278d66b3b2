"""Model families. Each family registers itself when imported from this explicit list."""

from . import (  # noqa: F401  (registration, from this explicit list)
    compressive,
    funnel,
    hat,
    lite,
    reformer,
    routing,
    seq2seq,
    transformer,
    transformer_xl,
)
from .base import EffiModel, ModelOutput
from .classifier import SequenceClassifier
from .compressive import CompressiveConfig, CompressiveTransformer
from .funnel import FunnelConfig, FunnelForMaskedLM, FunnelModel
from .reformer import ReformerConfig, ReformerLM
from .seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from .transformer import Transformer, VanillaConfig
from .transformer_xl import TransformerXL, XLConfig

__all__ = [
    "CompressiveConfig",
    "CompressiveTransformer",
    "EffiModel",
    "FunnelConfig",
    "FunnelForMaskedLM",
    "FunnelModel",
    "ModelOutput",
    "ReformerConfig",
    "ReformerLM",
    "SequenceClassifier",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "Transformer",
    "TransformerXL",
    "VanillaConfig",
    "XLConfig",
]
