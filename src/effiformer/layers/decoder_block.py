"""The Transformer decoder block: causal self-attention, cross-attention over the encoder
output, feed-forward (Vaswani et al. 2017, arXiv 1706.03762, sec. 3.1 and fig. 1).

Post-LN (``norm_first=False``, the paper and fairseq's default)::

    x = LN1(x + drop(self_attn(x)));  x = LN2(x + drop(cross_attn(x, memory)));
    x = LN3(x + drop(ffn(x)))

Pre-LN (Xiong et al. 2020, arXiv 2002.04745): ``x = x + drop(sublayer(LN(x)))`` for each of the
three; the model adds a final LayerNorm after the last block.

The block receives its parts ready-built (any registered causal self-attention as ``attn``,
a :class:`~effiformer.attention.cross.CrossAttention` as ``cross_attn``), so a model decides
what goes in without the block naming a mechanism.

Decoding state (explicit, per layer, threaded by :class:`~effiformer.layers.stack.LayerStack`):
:class:`DecoderLayerState` holds whatever the self-attention part returns as
``AttentionOutput.state`` (dense: a :class:`~effiformer.attention.base.KVCache` of the keys and
values so far; Lite Transformer: its convolution buffer) and the projected encoder memory of the
cross-attention (computed once per sentence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..attention.base import AttentionMask, AttentionOutput, KVCache

__all__ = ["DecoderBlock", "DecoderLayerState"]


@dataclass(frozen=True)
class DecoderLayerState:
    """One decoder layer's decoding state.

    self_attn: the self-attention part's state (rows R first); cross: the projected encoder
    output, (B, H, S, Dh) keys and values, one per source sentence (R = B * rows per sentence).
    """

    self_attn: Any
    cross: KVCache


class DecoderBlock(nn.Module):
    """dim: D; attn: causal self-attention part; cross_attn: cross-attention module; ffn: the
    position-wise feed-forward; norm_first: pre-LN; dropout: on each sub-layer's output."""

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        cross_attn: nn.Module,
        ffn: nn.Module,
        *,
        norm_first: bool = False,
        dropout: float = 0.0,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.attn, self.cross_attn, self.ffn = attn, cross_attn, ffn
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm3 = nn.LayerNorm(dim, eps=norm_eps)
        self.drop = nn.Dropout(dropout)

    def init_state(self, memory: Tensor, rows: int, memory_kv: KVCache | None = None) -> Any:
        """The state decoding starts from: the self-attention's empty state for ``rows`` decoder
        rows and the projected ``memory`` (B, S, D) (or ``memory_kv``, projected already)."""
        self_state = self.attn.init_decoding_state(rows, device=memory.device, dtype=memory.dtype)
        cross = self.cross_attn.project_memory(memory) if memory_kv is None else memory_kv
        return DecoderLayerState(self_state, cross)

    def reorder_state(self, state: DecoderLayerState, index: Tensor) -> DecoderLayerState:
        """Rows ``index`` of the self-attention state; the memory is per sentence and stays."""
        return DecoderLayerState(
            self.attn.reorder_decoding_state(state.self_attn, index), state.cross
        )

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: DecoderLayerState | None = None,
        positions: Any = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> AttentionOutput:
        """x: (R, T, D) target states -> AttentionOutput(out (R, T, D), state).

        ``mask``: the self-attention's (causal); ``memory``: (B, S, D) encoder output, used when
        ``state`` is None (teacher forcing: the projections are computed here); ``state``: the
        layer's :class:`DecoderLayerState` (incremental decoding; the next one is returned);
        ``memory_mask``: (B, S) bool, True on real source tokens."""
        if kv is not None:
            raise ValueError("a decoder block takes no kv (its memory comes as memory=/state=)")
        if state is not None and not isinstance(state, DecoderLayerState):
            raise ValueError(
                f"decoder state must be a DecoderLayerState, got {type(state).__name__}"
            )
        if state is None and memory is None:
            raise ValueError("a decoder block needs the encoder output (memory=) or a state")
        self_state = None if state is None else state.self_attn
        cross_state = None if state is None else state.cross
        cross_mask = AttentionMask(key_padding=memory_mask)
        cross_kv = memory if cross_state is None else None
        if self.norm_first:
            a = self.attn(self.norm1(x), mask=mask, state=self_state, positions=positions)
            x = x + self.drop(a.out)
            c = self.cross_attn(self.norm2(x), kv=cross_kv, mask=cross_mask, state=cross_state)
            x = x + self.drop(c.out)
            x = x + self.drop(self.ffn(self.norm3(x)))
        else:
            a = self.attn(x, mask=mask, state=self_state, positions=positions)
            x = self.norm1(x + self.drop(a.out))
            c = self.cross_attn(x, kv=cross_kv, mask=cross_mask, state=cross_state)
            x = self.norm2(x + self.drop(c.out))
            x = self.norm3(x + self.drop(self.ffn(x)))
        new_state = None if state is None else DecoderLayerState(a.state, c.state)
        updates = {f"attn.{k}": v for k, v in a.updates.items()}
        return AttentionOutput(out=x, state=new_state, aux=a.aux, updates=updates)
