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
- Attention-reconstruction loss (Algorithm 2), one per layer, returned as
  ``ModelOutput.aux["blocks.<layer>.attn_reconstruction"]``::

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

from dataclasses import dataclass

from torch import nn

from ..config import ConfigError
from ..layers.compression import COMPRESSIONS, CompressiveMemory, build_compression
from ..recipes import COMPRESSIVE_RECIPE, register_recipe
from ..registry import register_family, register_model
from .transformer_xl import RUNTIME_FIELDS, TransformerXL, XLConfig

__all__ = ["CompressiveConfig", "CompressiveTransformer", "build_compressive"]


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


class CompressiveTransformer(TransformerXL):
    """Transformer-XL with a per-layer compressed memory; state is a tuple over layers of
    ``(memory (B, n_m, D), compressed memory (B, n_cm, D))``. The memory policy is
    :class:`~effiformer.layers.compression.CompressiveMemory`; the per-layer f_c live in
    ``self.compressors``."""

    runtime_fields = RUNTIME_FIELDS | {"cmem_len"}

    def _memory_policy(self) -> CompressiveMemory:
        c = self.config
        self.compressors = nn.ModuleList(
            build_compression(c.compression, c.dim, c.compression_rate) for _ in range(c.n_layers)
        )
        return CompressiveMemory(
            self.compressors, mem_len=c.mem_len, cmem_len=c.cmem_len, rate=c.compression_rate
        )

    def aux_parameters(self) -> list[nn.Parameter]:
        """The compression networks f_c: trained by the attention-reconstruction loss only."""
        return list(self.compressors.parameters())


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
