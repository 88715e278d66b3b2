"""Encoder-decoder (cross) attention with the encoder's keys and values projected once.

Vaswani et al. 2017 (arXiv 1706.03762), sec. 3.2.3: "queries come from the previous decoder
layer, and the memory keys and values come from the output of the encoder". The encoder output
does not change while a sentence is decoded, so its key/value projections are computed once
(:meth:`CrossAttention.project_memory`, fairseq's ``static_kv`` incremental state) and handed to
every decoding step as ``state``: a :class:`~effiformer.attention.base.KVCache` that is not
extended.

Rows per sentence. Beam search decodes ``G`` rows (hypotheses) per source sentence. The memory is
kept once per sentence, (B, H, S, Dh), and the ``R = B * G`` decoder rows (sentence-major: row
``r`` belongs to sentence ``r // G``) are folded into the query axis: cross-attention has no mask
between queries, so queries ``(B, H, G * Tq, Dh)`` over keys ``(B, H, S, Dh)`` give exactly what
``G`` copies of the memory would, without the copies (fairseq repeats the encoder output per
beam and reorders it every step; here nothing is reordered).

Not a registered part: it is dense and full width in every model here (Lite Transformer keeps
encoder-decoder attention standard; HAT builds its own), and models build it directly.
"""

from __future__ import annotations

from torch import Tensor

from .base import AttentionMask, AttentionOutput, KVCache
from .dense import DenseAttention, sdpa

__all__ = ["CrossAttention"]


class CrossAttention(DenseAttention):
    """Dense multi-head attention of decoder states (R, Tq, D) over an encoder memory.

    ``forward(x, *, kv=memory, mask=AttentionMask(key_padding=(B, S)))`` projects the memory
    (B, S, D) itself; ``forward(x, *, state=project_memory(memory), mask=...)`` reuses the
    projections. Either way ``R`` must be a multiple of the memory's ``B`` (``R // B`` rows per
    sentence) and the returned ``state`` is the projected memory.
    """

    def project_memory(self, memory: Tensor) -> KVCache:
        """(B, S, D) encoder output -> its keys and values, (B, H, S, Dh) each."""
        if memory.dim() != 3 or memory.shape[-1] != self.dim:
            raise ValueError(f"memory must be (B, S, {self.dim}), got {tuple(memory.shape)}")
        return KVCache(self._heads(self.k_proj(memory)), self._heads(self.v_proj(memory)))

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: KVCache | None = None,
        positions: None = None,
    ) -> AttentionOutput:
        """x: (R, Tq, D); kv: memory (B, S, D) or ``state``: its projections -> out (R, Tq, D).

        ``mask.key_padding``: (B, S) bool, True on real source tokens; ``mask.causal`` must be
        False (every query sees the whole source)."""
        if (kv is None) == (state is None):
            raise ValueError("cross-attention needs exactly one of kv (the memory) and state")
        if state is not None and not isinstance(state, KVCache):
            raise ValueError(f"cross-attention state is a KVCache, got {type(state).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"cross-attention x must be (R, Tq, {self.dim}), got {tuple(x.shape)}")
        memory = self.project_memory(kv) if state is None else state
        b, s = memory.k.shape[0], memory.k.shape[2]
        r, tq = x.shape[0], x.shape[1]
        if r % b:
            raise ValueError(
                f"cross-attention has {r} decoder rows for {b} source sentences; the rows must be "
                "a whole number per sentence (sentence-major)"
            )
        if mask is not None and mask.causal:
            raise ValueError("cross-attention is not causal: pass AttentionMask(causal=False)")
        kp = None if mask is None else mask.key_padding
        if kp is not None and kp.shape != (b, s):
            raise ValueError(f"mask.key_padding must be (B={b}, S={s}), got {tuple(kp.shape)}")
        g = r // b
        q = self._heads(self.q_proj(x))  # (R, H, Tq, Dh)
        h, dh = q.shape[1], q.shape[3]
        q = q.view(b, g, h, tq, dh).transpose(1, 2).reshape(b, h, g * tq, dh)  # (B, H, G*Tq, Dh)
        p = self.dropout if self.training else 0.0
        o = sdpa(q, memory.k, memory.v, AttentionMask(key_padding=kp), p)  # (B, H, G*Tq, Dh)
        o = o.view(b, h, g, tq, dh).permute(0, 2, 3, 1, 4).reshape(r, tq, h * dh)  # (R, Tq, H*Dh)
        return AttentionOutput(out=self.o_proj(o), state=memory)

    def init_decoding_state(self, batch: int, *, device=None, dtype=None) -> KVCache:
        raise NotImplementedError(
            "cross-attention's state is the projected memory: use project_memory(encoder_output)"
        )
