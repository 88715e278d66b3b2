"""Model families. Each family registers itself when imported from this explicit list."""

from . import compressive, funnel, reformer, transformer, transformer_xl  # noqa: F401  (registration)
from .base import EffiModel, ModelOutput
from .compressive import CompressiveConfig, CompressiveTransformer
from .funnel import FunnelConfig, FunnelForMaskedLM, FunnelModel
from .reformer import ReformerConfig, ReformerLM
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
    "Transformer",
    "TransformerXL",
    "VanillaConfig",
    "XLConfig",
]
