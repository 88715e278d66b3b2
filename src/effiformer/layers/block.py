"""A Transformer block that receives its parts (attention, feed-forward, norms) ready-built.

Pre-LN (``norm_first=True``, Xiong et al. 2020): x + drop(attn(LN x)); x + drop(ffn(LN x)).
Post-LN (Vaswani et al. 2017): LN(x + drop(attn x)); LN(x + drop(ffn x)).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
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

    def attention_input(self, t: Tensor, *, stop_gradient: bool = False) -> Tensor:
        """What this block's attention sees for states ``t`` (B, T, D): ``t`` itself (post-LN)
        or its pre-LN norm; with ``stop_gradient`` the norm's weights are detached (the
        Compressive Transformer's attention-reconstruction loss trains f_c alone)."""
        if not self.norm_first:
            return t
        n = self.norm1
        if not stop_gradient:
            return n(t)
        w = None if n.weight is None else n.weight.detach()
        b = None if n.bias is None else n.bias.detach()
        return F.layer_norm(t, n.normalized_shape, w, b, n.eps)

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: Any = None,
        positions: Any = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D), kv: (B, Tk, D) or None -> AttentionOutput with out (B, Tq, D); the
        attention's ``updates`` come back keyed relative to this block (``attn.NAME``) and its
        ``replay`` unchanged."""
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
        updates = {f"attn.{k}": v for k, v in a.updates.items()}
        return AttentionOutput(out=x, state=a.state, aux=a.aux, updates=updates, replay=a.replay)
