"""Dense multi-head attention, the oracle every mechanism is checked against.

Vaswani et al. 2017 (arXiv 1706.03762), eq. 1: softmax(Q K^T / sqrt(d_head)) V, computed by
``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on CPU and CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    KVCache,
    check_attention_inputs,
    reference_attention,
)
from .registry import register_attention

__all__ = ["DenseConfig", "DenseAttention", "sdpa", "reference_attention"]


@dataclass(frozen=True, kw_only=True)
class DenseConfig(AttentionConfig):
    """Dense multi-head attention. ``bias``: biases on the Q, K, V, O projections."""

    name = "dense"

    bias: bool = True


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


class DenseAttention(AttentionPart):
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
        self.config = DenseConfig(bias=bias)
        self.dims = AttentionDims(dim, n_heads, head_dim, causal=False, dropout=dropout)

    @classmethod
    def from_config(cls, config: DenseConfig, dims: AttentionDims) -> DenseAttention:
        m = cls(dims.dim, dims.n_heads, dims.head_dim, dropout=dims.dropout, bias=config.bias)
        m.config, m.dims = config, dims
        return m

    @classmethod
    def mult_adds(cls, config, dims, tq, tk, *, taps=False) -> int | None:
        """Q and O projections of the ``tq`` queries, K and V of the ``tk`` keys (D x H*Dh each),
        ``Q K^T`` and the weighted sum of V (``tq * tk * H*Dh`` each). Only for
        :class:`DenseConfig` itself (a subclass's part computes something else)."""
        if type(config) is not DenseConfig:
            return None
        inner = dims.n_heads * dims.head_dim
        return 2 * tq * dims.dim * inner + 2 * tk * dims.dim * inner + 2 * tq * tk * inner

    def init_decoding_state(self, batch: int, *, device=None, dtype=None) -> KVCache:
        """An empty :class:`~effiformer.attention.base.KVCache` (B, H, 0, Dh)."""
        return KVCache.empty(batch, self.n_heads, self.head_dim, device=device, dtype=dtype)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: KVCache | None = None,
        positions: None = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D); kv: (B, Tk, D) or None -> out (B, Tq, D).

        ``state``: a :class:`~effiformer.attention.base.KVCache` for incremental decoding
        (self-attention only): the new keys/values are appended to it, the queries attend over
        ``cache ++ new`` (a causal mask aligns them to the last keys; ``mask.key_padding``, if
        any, covers all of them) and the longer cache is returned as ``.state``."""
        if state is not None and not isinstance(state, KVCache):
            raise ValueError(
                f"DenseAttention's state is a KVCache or None, got {type(state).__name__}"
            )
        if state is not None and kv is not None:
            raise ValueError("a KVCache is for self-attention decoding; pass kv=None with state")
        check_attention_inputs(x, kv, self.dim, mask, past=0 if state is None else state.length)
        src = x if kv is None else kv
        q, k, v = (
            self._heads(self.q_proj(x)),
            self._heads(self.k_proj(src)),
            self._heads(self.v_proj(src)),
        )
        new_state = None
        if state is not None:
            new_state = state.extend(k, v)
            k, v = new_state.k, new_state.v  # (B, H, Tpast + Tq, Dh)
        p = self.dropout if self.training else 0.0
        o = sdpa(q, k, v, mask, p)  # (B, H, Tq, Dh)
        o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)  # (B, Tq, H*Dh)
        return AttentionOutput(out=self.o_proj(o), state=new_state)


register_attention(
    "dense",
    DenseConfig,
    DenseAttention,
    description="softmax(QK^T/sqrt(d))V on SDPA (Vaswani et al. 2017)",
)
