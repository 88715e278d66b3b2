"""Kernels one floor below the attention mechanisms: they import torch only, and each says why it
cannot run a call (``None`` when it can). The mechanisms (``effiformer.attention``) keep their
configs, modules and the papers' mathematics and call the ops here.

- :mod:`.flash_cpu`: PyTorch's CPU flash-attention forward and backward (the kernel
  ``F.scaled_dot_product_attention`` runs on CPU), looked up once, with
  :func:`~.flash_cpu.flash_unavailable`.
"""

from .flash_cpu import (
    FLASH_DTYPES,
    flash_available,
    flash_backward,
    flash_forward,
    flash_unavailable,
)

__all__ = [
    "FLASH_DTYPES",
    "flash_available",
    "flash_backward",
    "flash_forward",
    "flash_unavailable",
]
