"""Attention mechanisms, one file each, all behind the interface in :mod:`.base`."""

from .base import AttentionMask, AttentionOutput, dense_bool_mask
from .dense import DenseAttention, sdpa

__all__ = ["AttentionMask", "AttentionOutput", "DenseAttention", "dense_bool_mask", "sdpa"]
