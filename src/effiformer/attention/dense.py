"""Dense multi-head attention, the oracle every mechanism is checked against.

Vaswani et al. 2017 (arXiv 1706.03762), eq. 1: softmax(Q K^T / sqrt(d_head)) V, computed by
``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on CPU and CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import AttentionMask, AttentionOutput, check_attention_inputs

__all__ = ["DenseAttention", "sdpa"]


def sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | None, dropout_p: float = 0.0
) -> Tensor:
    """SDPA over (B, H, Tq, Dh) x (B, H, Tk, Dh) with the interface's mask semantics."""
    tq, tk = q.shape[-2], k.shape[-2]
    if mask is None or (not mask.causal and mask.key_padding is None):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if mask.causal and mask.key_padding is None and tq == tk:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    keep = mask.to_bool(tq, tk, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)


class DenseAttention(nn.Module):
    """Multi-head attention with separate Q, K, V, O projections.

    Args:
        dim: model width D.
        n_heads: H.
        head_dim: Dh (``n_heads * head_dim`` need not equal ``dim``).
        dropout: attention-weight dropout (training only).
        bias: whether the projections have biases.
    """

    def __init__(
        self, dim: int, n_heads: int, head_dim: int, *, dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        self.dim, self.n_heads, self.head_dim = dim, n_heads, head_dim
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(dim, inner, bias=bias)
        self.k_proj = nn.Linear(dim, inner, bias=bias)
        self.v_proj = nn.Linear(dim, inner, bias=bias)
        self.o_proj = nn.Linear(inner, dim, bias=bias)
        self.dropout = dropout

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: None = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D); kv: (B, Tk, D) or None -> out (B, Tq, D). Dense attention is stateless."""
        check_attention_inputs(x, kv, self.dim, mask)
        if state is not None:
            raise ValueError("DenseAttention takes no state; pass state=None")
        src = x if kv is None else kv
        q, k, v = (
            self._heads(self.q_proj(x)),
            self._heads(self.k_proj(src)),
            self._heads(self.v_proj(src)),
        )
        p = self.dropout if self.training else 0.0
        o = sdpa(q, k, v, mask, p)  # (B, H, Tq, Dh)
        o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)  # (B, Tq, H*Dh)
        return AttentionOutput(out=self.o_proj(o))


def reference_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None) -> Tensor:
    """Plain matmul-softmax attention (for tests): (B,H,Tq,Dh),(B,H,Tk,Dh) -> (B,H,Tq,Dh)."""
    scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
