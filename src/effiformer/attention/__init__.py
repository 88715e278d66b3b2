"""Attention mechanisms, one file each, all behind the interface in :mod:`.base`.

Each mechanism file registers itself (:func:`~effiformer.attention.registry.register_attention`)
when imported from the explicit list below.
"""

from . import (  # noqa: F401  (registration, from this explicit list)
    adaptive_span,
    dense,
    funnel_relative,
    local,
    lsh,
    lsra,
    pattern,
    relative_xl,
    routing,
    sparse,
)
from .base import (
    AttentionConfig,
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    dense_bool_mask,
)
from .dense import DenseAttention, DenseConfig, sdpa
from .registry import build_attention, get_attention, list_attentions, register_attention

__all__ = [
    "AttentionConfig",
    "AttentionDims",
    "AttentionMask",
    "AttentionOutput",
    "AttentionPart",
    "DenseAttention",
    "DenseConfig",
    "PrepareContext",
    "build_attention",
    "dense_bool_mask",
    "get_attention",
    "list_attentions",
    "register_attention",
    "sdpa",
]
