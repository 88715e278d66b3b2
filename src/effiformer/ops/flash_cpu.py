"""PyTorch's CPU flash-attention kernel, called directly: the forward
``aten._scaled_dot_product_flash_attention_for_cpu`` (what ``F.scaled_dot_product_attention``
runs on CPU) returns the output and the log-sum-exp of each query row, and its backward takes
them back, so a mechanism's own autograd node can keep q, k, v, the output and the log-sum-exp
only and recompute the scores in the backward, as SDPA's node does. The local, sparse, LSH and
routing kernels use it on views of the caller's tensors (strided windows, gathered clusters).

Looked up once here; :func:`flash_unavailable` is the one availability check (a reason, or
``None`` when the kernel can run the call). Both functions are ``None`` in a build without the
kernel.

Signatures (as aten has them): ``flash_forward(q, k, v, dropout_p, is_causal, *, attn_mask=None,
scale=None) -> (out, lse)`` with q (B, H, Tq, Dh), k, v (B, H, Tk, Dh), out (B, H, Tq, Dh), lse
(B, H, Tq) float32 for float32 inputs; ``flash_backward(grad_out, q, k, v, out, lse, dropout_p,
is_causal, *, attn_mask=None, scale=None) -> (dq, dk, dv)``. ``is_causal`` masks keys after the
query's own index (top-left aligned); ``attn_mask`` is additive, of q's dtype (``-inf`` hides
a key; the kernel refuses boolean masks), broadcastable to (B, H, Tq, Tk).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "FLASH_DTYPES",
    "flash_available",
    "flash_backward",
    "flash_forward",
    "flash_unavailable",
]


def _lookup(name: str) -> Callable | None:
    try:
        return getattr(torch.ops.aten, name).default
    except (AttributeError, RuntimeError):  # an older or stripped build
        return None


flash_forward = _lookup("_scaled_dot_product_flash_attention_for_cpu")
flash_backward = _lookup("_scaled_dot_product_flash_attention_for_cpu_backward")

#: dtypes the kernel takes
FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def flash_available() -> bool:
    """Whether this torch build has the kernel (forward and backward)."""
    return flash_forward is not None and flash_backward is not None


def flash_unavailable(
    q: Tensor, *, dropout_p: float = 0.0, dtypes: tuple[torch.dtype, ...] = FLASH_DTYPES
) -> str | None:
    """Why the CPU flash kernel cannot run attention on ``q`` (and its k, v of the same device
    and dtype), or ``None`` when it can. ``dropout_p``: the caller's attention dropout (the
    kernel's own dropout mask cannot be replayed by a caller's backward, so callers keep it at
    0); ``dtypes``: the dtypes the caller accepts (a subset of :data:`FLASH_DTYPES`)."""
    if not flash_available():
        return "this torch build has no CPU flash-attention kernel"
    if q.device.type != "cpu":
        return f"it runs the CPU flash-attention kernel (got a {q.device.type} tensor)"
    if q.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"it takes {names} (got {q.dtype})"
    if dropout_p:
        return "attention dropout needs the mask SDPA draws (use dropout_p=0)"
    return None
