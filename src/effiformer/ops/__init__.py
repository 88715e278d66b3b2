"""Kernels one floor below the attention mechanisms: they import torch only, and each says why it
cannot run a call (``None`` when it can). The mechanisms (``effiformer.attention``) keep their
configs, modules and the papers' mathematics and call the ops here.

- :mod:`.flash_cpu`: PyTorch's CPU flash-attention forward and backward (the kernel
  ``F.scaled_dot_product_attention`` runs on CPU), looked up once, with
  :func:`~.flash_cpu.flash_unavailable`.
- :mod:`.lsh_chunked`: LSH attention's chunked kernel over the sorted sequence.
- :mod:`.tiled_sparse`: the Sparse Transformer's tiled engine (dense tile calls, merged exactly).
- :mod:`.strided_local`: blocked local attention read in place (the local heads).
- :mod:`.routed`: attention inside clusters of sorted token indices (the routed heads).
- :mod:`.funnel_core`: Funnel-Transformer's fused relative-attention core (content, position and
  token-type terms by chunks of query rows, probabilities recomputed in the backward).
- :mod:`.flex_patterns`: FlexAttention over a mechanism's ``mask_mod`` (the device backend of
  the local and sparse patterns).
- :mod:`.reference`: the O(T^2) references the kernels are checked against.

The kernels with a hand-written backward are registered operators (``torch.library.custom_op``,
namespace ``effiformer``): ``torch.compile`` and ``torch.export`` see one opaque op each.
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
