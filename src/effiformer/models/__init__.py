"""Model families. Each family registers itself when imported from this explicit list."""

from . import compressive, funnel, hat, routing, seq2seq, transformer, transformer_xl  # noqa: F401
from .base import EffiModel, ModelOutput
from .classifier import SequenceClassifier
from .compressive import CompressiveConfig, CompressiveTransformer
from .funnel import FunnelConfig, FunnelForMaskedLM, FunnelModel
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
    "SequenceClassifier",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "Transformer",
    "TransformerXL",
    "VanillaConfig",
    "XLConfig",
]
