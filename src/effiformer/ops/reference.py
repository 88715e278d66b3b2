"""The O(T^2) references the kernels are checked against: plain attention with a boolean
keep-mask, materialising every (query, key) score. Nothing here is fast; the tests (and the
``impl="dense"`` reference paths) use them, the kernels never do.

- :func:`reference_attention`: matmul, ``-inf`` where not kept, softmax (a row with no key is
  NaN, as a softmax over nothing);
- :func:`masked_attention`: SDPA with the keep-mask, a row with no key gives zeros (the
  convention of the tiled and flex kernels).

References that encode a mechanism's own mathematics stay with it: LSH's shared-QK logits with
its self and causal offsets (``attention.lsh.shared_qk_reference``), the adaptive-span ramp
(``attention.adaptive_span.adaptive_span_reference``), the sparse patterns as dense masks
(``attention.sparse.pattern_mask``), LSH's combined per-round weights computed by the kernel's
own blocks (``ops.lsh_chunked.chunked_attention_weights``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["masked_attention", "reference_attention"]


def reference_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None) -> Tensor:
    """Plain matmul-softmax attention: (B,H,Tq,Dh),(B,H,Tk,Dh) -> (B,H,Tq,Dh); ``keep`` a boolean
    keep-mask broadcastable to (B, H, Tq, Tk)."""
    scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, dropout_p: float = 0.0
) -> Tensor:
    """Dense attention with a boolean keep-mask broadcastable to (B, H, Tq, Tk); q, k, v are
    (B, H, T, Dh). Rows without any key give 0."""
    has = keep.any(-1, keepdim=True)  # (.., Tq, 1)
    safe = keep | ~has  # an empty row attends everything, then is zeroed
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, dropout_p=dropout_p)
    return o.masked_fill(~has, 0.0)
