"""Compressive Transformer: Transformer-XL plus a compressed memory trained by attention
reconstruction.

Rae, Potapenko, Jayakumar, Hillier, Lillicrap 2019, "Compressive Transformers for Long-Range
Sequence Modelling", arXiv 1911.05507, sec. 3 and Algorithms 1-2.

Implemented (Algorithm 1), on the Transformer-XL of :mod:`.transformer_xl` (relative attention,
post-LN by default, adaptive input/softmax options):

- Per layer two FIFO queues, both initialised to **zeros** as in the paper (``init_state``): a
  memory of ``mem_len`` (n_m) slots and a compressed memory of ``cmem_len`` (n_cm) slots.
- Attention of the segment's queries over ``[compressed memory; memory; segment]``, with the
  relative sinusoid over all ``n_cm + n_m + T`` keys (distances measured in slots).
- After each segment: the layer's input is pushed into the memory; the states pushed out
  (``old_mem``, oldest first, ``n_s = T`` of them once the memory is full) are compressed by this
  layer's own f_c with rate c (:mod:`effiformer.layers.compression`: ``conv`` (default), ``max``,
  ``mean``, ``dilated_conv``, ``most_used``) into ``floor(n_s / c)`` slots appended to the
  compressed memory, which keeps its last ``n_cm``. Both queues are returned detached in
  ``ModelOutput.state`` = tuple over layers of ``(memory (B, n_m, D), cmem (B, n_cm, D))``.
- ``most_used`` keeps the evicted slots with the highest attention weight received in the segment
  that evicts them (summed over heads and queries), computed honestly with the layer's own
  attention probabilities (:meth:`RelativeXLAttention.attention_probs`, one extra score pass per
  layer, under ``no_grad``).
- Attention-reconstruction loss (Algorithm 2), summed over layers and returned as
  ``ModelOutput.aux["attn_reconstruction"]``::

      L_attn = sum_l || attn(h_l, old_mem_l) - attn(h_l, f_c(old_mem_l)) ||_2

  ``attn`` is content-only attention with the layer's own query/key/value weights
  (:meth:`RelativeXLAttention.content_attention`), output before the output projection; ``h``,
  ``old_mem`` and those weights are stop-gradiented, so this loss trains f_c alone. The compressed
  memory enters later segments only through the detached state, so the task loss never reaches
  f_c. A trainer therefore adds ``aux`` to the task loss and does one backward (``total_loss``);
  no weighting coefficient. The two losses train disjoint parameters and their gradients differ
  in scale by 100-1000x (the reconstruction loss is an unnormalised norm), so the trainer clips
  f_c's gradients (:meth:`aux_parameters`) separately from the rest, as two optimisers would;
  clipped as one group, the reconstruction gradient would shrink the task gradient by that factor
  and the model would hardly learn. The loss is computed only when gradients are enabled and f_c has
  parameters (``conv``, ``dilated_conv``). With ``norm_first`` the attention inputs are the
  layer's (stop-gradient) LayerNorm of ``h`` and of the memories, which is what that layer's
  attention really sees.

Deviations / choices: the L2 norm is the plain Frobenius norm over batch, queries and channels
(not lucidrains' MSE averaged over layers). When the number of evicted states is not a multiple
of c, the oldest remainder is dropped (logged once per shape). ``same_length`` windows cover
``mem_len + cmem_len`` slots. Generation with 1-token segments and c > 1 compresses nothing
(``floor(1 / c) = 0``): generate with segments of at least c tokens if the compressed memory
matters. Unlike lucidrains/compressive-transformer-pytorch we never ``detach_()`` a weight in
place (that froze its key/value weights), and we keep the paper's post-LN residuals, u/v biases
and zero-initialised memories.

Registered: ``compressive-tiny``, ``compressive-small``, ``compressive-enwik8`` (24L, window 768,
memory 768, compressed 1152, c=3), ``compressive-wt103`` (18L, 512/512/512, c=4, adaptive softmax
as ``xl-wt103-large``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import AttentionMask
from ..config import ConfigError
from ..layers import TransformerBlock
from ..layers.compression import COMPRESSIONS, build_compression
from ..layers.memory import push_and_evict
from ..recipes import COMPRESSIVE_RECIPE, register_recipe
from ..registry import register_family, register_model
from .transformer_xl import RUNTIME_FIELDS, TransformerXL, XLConfig

__all__ = ["CompressiveConfig", "CompressiveTransformer", "build_compressive"]

logger = logging.getLogger(__name__)
_warned_remainders: set[tuple[int, int]] = set()


@dataclass(frozen=True, kw_only=True)
class CompressiveConfig(XLConfig):
    """Compressive Transformer: ``mem_len`` (n_m), ``cmem_len`` (n_cm), ``compression_rate``
    (c), ``compression`` (f_c, one of conv, max, mean, dilated_conv, most_used); everything else
    as :class:`XLConfig`."""

    family = "compressive"

    cmem_len: int = 0
    compression_rate: int = 3
    compression: str = "conv"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.cmem_len, bool) or not isinstance(self.cmem_len, int):
            raise ConfigError(f"cmem_len must be an int >= 0, got {self.cmem_len!r}")
        if self.cmem_len < 0:
            raise ConfigError(f"cmem_len must be >= 0, got {self.cmem_len}")
        self._check_positive("compression_rate")
        self._check_choice("compression", COMPRESSIONS)

    def _window(self) -> int:
        return self.mem_len + self.cmem_len


def _attn_input(block: TransformerBlock, t: Tensor) -> Tensor:
    """What ``block``'s attention sees for states ``t``: ``t`` (post-LN) or its stop-gradient
    pre-LN norm."""
    if not block.norm_first:
        return t
    n = block.norm1
    w = None if n.weight is None else n.weight.detach()
    b = None if n.bias is None else n.bias.detach()
    return F.layer_norm(t, n.normalized_shape, w, b, n.eps)


class CompressiveTransformer(TransformerXL):
    """Transformer-XL with a per-layer compressed memory; state is a tuple over layers of
    ``(memory (B, n_m, D), compressed memory (B, n_cm, D))``."""

    runtime_fields = RUNTIME_FIELDS | {"cmem_len"}

    def __init__(self, config: CompressiveConfig) -> None:
        super().__init__(config)
        c = config
        self.compressors = nn.ModuleList(
            build_compression(c.compression, c.dim, c.compression_rate) for _ in range(c.n_layers)
        )

    def aux_parameters(self) -> list[nn.Parameter]:
        """The compression networks f_c: trained by the attention-reconstruction loss only."""
        return list(self.compressors.parameters())

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """Zero-filled FIFO queues: per layer ((B, n_m, D), (B, n_cm, D))."""
        c = self.config
        dt = self._param_dtype()
        return tuple(
            (
                torch.zeros(batch_size, c.mem_len, c.dim, device=device, dtype=dt),
                torch.zeros(batch_size, c.cmem_len, c.dim, device=device, dtype=dt),
            )
            for _ in range(c.n_layers)
        )

    def _check_state(self, state: Any, batch_size: int, ref: Tensor) -> Any:
        c = self.config
        if not isinstance(state, (tuple, list)) or len(state) != c.n_layers:
            raise ValueError(
                f"state must be a tuple of {c.n_layers} (memory, compressed memory) pairs from "
                "init_state() or a previous output's .state"
            )
        shapes = None
        for i, pair in enumerate(state):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"state[{i}] must be a (memory, compressed memory) pair")
            for name, t in zip(("memory", "compressed memory"), pair):
                if not isinstance(t, Tensor) or t.dim() != 3:
                    raise ValueError(f"state[{i}] {name} must be a (B, M, {c.dim}) tensor")
                if t.shape[0] != batch_size or t.shape[2] != c.dim:
                    raise ValueError(
                        f"state[{i}] {name} must be (B={batch_size}, M, D={c.dim}), got "
                        f"{tuple(t.shape)}"
                    )
                if t.dtype != ref.dtype or t.device != ref.device:
                    raise ValueError(
                        f"state[{i}] {name} must be {ref.dtype} on {ref.device}, got {t.dtype} "
                        f"on {t.device}"
                    )
            s = (pair[0].shape[1], pair[1].shape[1])
            if shapes is not None and s != shapes:
                raise ValueError("every layer's memories in state must have the same lengths")
            shapes = s
        return tuple(tuple(p) for p in state)

    def _layers(self, x: Tensor, state: Any) -> tuple[Tensor, Any, dict[str, Tensor]]:
        """x: (B, T, D) -> (last hidden (B, T, D), next ((mem, cmem), ...), aux losses)."""
        c = self.config
        m, cm = state[0][0].shape[1], state[0][1].shape[1]
        positions = self._positions(cm + m + x.shape[1], x)
        mask = AttentionMask(causal=True)
        new_state = []
        recon: Tensor | None = None
        for block, f_c, (mem, cmem) in zip(self.blocks, self.compressors, state):
            new_mem, old_mem = push_and_evict(mem, x, c.mem_len)  # both detached
            kv = torch.cat([cmem, mem, x], dim=1)  # (B, n_cm + n_m + T, D)
            n_old = old_mem.shape[1]
            if n_old % c.compression_rate and (n_old, c.compression_rate) not in _warned_remainders:
                _warned_remainders.add((n_old, c.compression_rate))
                logger.warning(
                    "%d evicted memories are not a multiple of compression_rate=%d: the oldest "
                    "%d are dropped; use segments whose length is a multiple of the rate",
                    n_old,
                    c.compression_rate,
                    n_old % c.compression_rate,
                )
            usage = None
            if f_c.needs_usage and n_old:
                with torch.no_grad():
                    probs = block.attn.attention_probs(
                        _attn_input(block, x),
                        kv=_attn_input(block, kv),
                        mask=mask,
                        positions=positions,
                    )  # (B, H, T, Tk)
                usage = probs.sum(dim=(1, 2))[:, cm : cm + n_old]  # (B, n_old): old_mem's keys
            compressed = f_c(old_mem, usage)  # (B, n_old // c, D); grad reaches f_c only
            trainable = any(p.requires_grad for p in f_c.parameters())
            if torch.is_grad_enabled() and trainable and compressed.shape[1]:
                h = _attn_input(block, x.detach())
                target = block.attn.content_attention(h, _attn_input(block, old_mem))
                pred = block.attn.content_attention(h, _attn_input(block, compressed))
                loss = torch.linalg.vector_norm(target - pred)
                recon = loss if recon is None else recon + loss
            cat = torch.cat([cmem, compressed.detach()], dim=1)  # (B, n_cm + n_old // c, D)
            new_cmem = cat[:, max(0, cat.shape[1] - c.cmem_len) :]
            new_state.append((new_mem, new_cmem))
            x = block(x, kv=kv, mask=mask, positions=positions).out
        aux = {} if recon is None else {"attn_reconstruction": recon}
        return x, tuple(new_state), aux


def build_compressive(config: CompressiveConfig) -> CompressiveTransformer:
    return CompressiveTransformer(config)


register_family(CompressiveConfig, build_compressive)
register_recipe("compressive", COMPRESSIVE_RECIPE)

register_model(
    "compressive-tiny",
    CompressiveConfig(
        dim=64, n_heads=2, n_layers=2, ffn_dim=128, seq_len=16, mem_len=16, cmem_len=16,
        compression_rate=2, dropout=0.0,
    ),
    "2 layers, d 64, byte vocab, window = memory = compressed = 16, c 2: for tests",
)  # fmt: skip
register_model(
    "compressive-small",
    CompressiveConfig(
        dim=256, n_heads=4, n_layers=4, ffn_dim=1024, seq_len=256, mem_len=128, cmem_len=128,
        compression_rate=4, dropout=0.1,
    ),
    "xl-small size; memory 128 + compressed 128 (c 4): same attention length as xl-small",
)  # fmt: skip
register_model(
    "compressive-enwik8",
    CompressiveConfig(
        dim=1024, n_heads=8, head_dim=128, n_layers=24, ffn_dim=3072, seq_len=768, mem_len=768,
        cmem_len=1152, compression_rate=3, dropout=0.15, attn_dropout=0.15, untie_r=True,
    ),
    "paper sec. 5.1: 24L (xl-enwik8-large widths), window 768, memory 768, compressed 1152, c 3",
)  # fmt: skip
register_model(
    "compressive-wt103",
    CompressiveConfig(
        dim=1024, n_heads=16, head_dim=64, n_layers=18, ffn_dim=4096, seq_len=512, mem_len=512,
        cmem_len=512, compression_rate=4, dropout=0.2, attn_dropout=0.2, untie_r=True,
        vocab_size=267735, adaptive=True, cutoffs=(20000, 40000, 200000), div_val=4,
    ),
    "paper sec. 5.2: 18L (xl-wt103-large widths, adaptive softmax div_val 4), 512/512/512, c 4",
)  # fmt: skip
