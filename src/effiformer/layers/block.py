"""A Transformer block that receives its parts (attention, feed-forward, norms) ready-built.

Pre-LN (``norm_first=True``, Xiong et al. 2020): x + drop(attn(LN x)); x + drop(ffn(LN x)).
Post-LN (Vaswani et al. 2017): LN(x + drop(attn x)); LN(x + drop(ffn x)).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..attention.base import AttentionMask, AttentionOutput

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        ffn: nn.Module,
        *,
        norm_first: bool = True,
        dropout: float = 0.0,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.attn, self.ffn = attn, ffn
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: Any = None,
        positions: Any = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D), kv: (B, Tk, D) or None -> AttentionOutput with out (B, Tq, D)."""
        if self.norm_first:
            h = self.norm1(x)
            src = None if kv is None else self.norm1(kv)
            a = self.attn(h, kv=src, mask=mask, state=state, positions=positions)
            x = x + self.drop(a.out)
            x = x + self.drop(self.ffn(self.norm2(x)))
        else:
            a = self.attn(x, kv=kv, mask=mask, state=state, positions=positions)
            x = self.norm1(x + self.drop(a.out))
            x = self.norm2(x + self.drop(self.ffn(x)))
        return AttentionOutput(out=x, state=a.state, aux=a.aux, updates=a.updates)
