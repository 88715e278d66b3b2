"""The Reformer language model: reversible two-stream layers, LSH and local attention, axial
positions, chunked feed-forward and chunked loss.

Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer", arXiv 2001.04451, following
trax's ``ReformerLM`` (``trax/models/reformer/reformer.py``) and the enwik8 config
(``trax/supervised/configs/reformer_enwik8.gin``)::

    ids -> Embedding(V, D) -> dropout -> + axial positions -> (x, x)
        -> N reversible blocks  Y1 = X1 + Attn(LN X2),  Y2 = X2 + FFN(LN Y1)
        -> concat(Y1, Y2) (2D) -> LayerNorm(2D) -> dropout -> Linear(2D, V)

**Why a family of its own** (the vanilla stack cannot express it): the residual stream is two
streams of width D carried by :class:`~effiformer.layers.reversible.ReversibleStack` (a custom
backward that reconstructs activations instead of storing them), the head reads their
concatenation (2D, not D, so embeddings cannot be tied), positions are the axial encodings, and
the feed-forward and the loss run over sequence chunks inside the reversible backward. The
attention of every layer is any registered part by configuration (default: LSH; the enwik8
recipe: the ``pattern`` ``[local, local, lsh, local]``); LSH and local attention also drop into
the ``vanilla`` family (``attention={"name": "lsh", ...}``), which is how the equal-size dense
comparisons run.

Initialisation follows trax: token embeddings uniform with variance 1/D (``ScaledInitializer``
fan_out), axial encodings N(0, 1), every linear weight Glorot-uniform (trax's ``Dense`` and its
attention kernels' per-total-width Glorot), biases 0. FFN: ReLU (the enwik8 config), dropout
after its first layer and on its output (trax ``_FeedForward``: Dense, Dropout, activation,
Dense; then Dropout). Deviation: embedding and output dropout drop individual elements (trax
shares one mask along the length axis, ``shared_axes=[-2]``).

``n_hashes`` (and the chunk lengths, dropout, ``seq_len``) change no weights:
:func:`reconfigure` rebuilds a trained model with other values, e.g. evaluation with more
hashes than in training (the paper's Table 2).

Registered: ``reformer-tiny`` (tests), ``reformer-small`` (vanilla-small's size, for CPU
comparisons), ``reformer-enwik8`` (12 layers, d 1024, 8 heads of 64, d_ff 4096, the
[local, local, LSH, local] pattern with LSH chunk 256 / 2 hashes / 512 buckets and local chunk 128,
axial (128, 512) x (256, 768), seq_len 65536, dropout 0.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import AttentionConfig, AttentionDims, AttentionMask, PrepareContext
from ..attention.local import LocalConfig
from ..attention.lsh import LSHConfig, with_n_hashes
from ..attention.pattern import PatternConfig
from ..attention.registry import build_attention
from ..config import ConfigError, ModelConfig, replace_config
from ..layers import FeedForward, build_positions, prefix_keys
from ..layers.chunked import chunked_lm_loss
from ..layers.ffn import ACTIVATIONS
from ..layers.positions import AxialPositions
from ..layers.reversible import ReversibleBlock, ReversibleStack
from ..recipes import REFORMER_RECIPE, register_recipe
from ..registry import build_model, register_family, register_model
from .base import EffiModel, ModelOutput, lm_loss

__all__ = ["ReformerConfig", "ReformerLM", "build_reformer", "reconfigure", "RUNTIME_FIELDS"]

#: Config fields that change no weight (plus ``attention.n_hashes``, see :func:`reconfigure`).
RUNTIME_FIELDS = frozenset(
    {"dropout", "attn_dropout", "ffn_chunk", "loss_chunk", "reversible", "n_hashes"}
)


def default_axial_shape(seq_len: int) -> tuple[int, int]:
    """(n1, n2) with n1 = 2**floor(log2(sqrt(L))) and n1 * n2 >= L (65536 -> (256, 256))."""
    n1 = 2 ** int(math.floor(math.log2(math.sqrt(seq_len)))) if seq_len > 1 else 1
    return n1, -(-seq_len // n1)


@dataclass(frozen=True, kw_only=True)
class ReformerConfig(ModelConfig):
    """Reformer LM. ``attention``: every layer's part (default LSH, chunk 64, 2 hashes; a
    ``pattern`` varies it by layer); ``positions``: "axial" (default), "learned" or
    "sinusoidal"; ``axial_shape`` (n1, n2) with n1 * n2 >= seq_len (default
    :func:`default_axial_shape`) and ``axial_dims`` (d1, d2) summing to ``dim`` (default
    (dim // 4, dim - dim // 4), trax's enwik8 proportion); ``reversible``: the custom backward
    (False: ordinary autograd through the same network); ``ffn_chunk`` / ``loss_chunk``:
    positions per chunk of the feed-forward and of the output loss (None: unchunked)."""

    family = "reformer"

    attention: AttentionConfig = field(default_factory=lambda: LSHConfig(chunk_len=64, n_hashes=2))
    positions: str = "axial"
    axial_shape: tuple[int, ...] | None = None
    axial_dims: tuple[int, ...] | None = None
    activation: str = "relu"
    reversible: bool = True
    ffn_chunk: int | None = None
    loss_chunk: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("positions", ("axial", "learned", "sinusoidal"))
        self._check_choice("activation", tuple(ACTIVATIONS))
        if self.mem_len != 0:
            raise ConfigError("mem_len must be 0 for the Reformer (it has no memory)")
        for name in ("ffn_chunk", "loss_chunk"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name} must be None or a positive integer, got {v!r}")
        if self.positions == "axial":
            shape, dims = self.axial
            if len(shape) != 2 or any(n < 1 for n in shape):
                raise ConfigError(f"axial_shape must be two positive ints, got {shape}")
            if shape[0] * shape[1] < self.seq_len:
                raise ConfigError(
                    f"axial_shape {shape} covers {shape[0] * shape[1]} positions, fewer than "
                    f"seq_len={self.seq_len}"
                )
            if len(dims) != 2 or any(d < 1 for d in dims) or sum(dims) != self.dim:
                raise ConfigError(
                    f"axial_dims must be two positive ints summing to dim={self.dim}, got {dims}"
                )
        elif self.axial_shape is not None or self.axial_dims is not None:
            raise ConfigError("axial_shape / axial_dims need positions='axial'")

    @property
    def axial(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The axial (shape, dims) in use: the fields, or their defaults derived from
        ``seq_len`` and ``dim`` (derived, so changing ``seq_len`` re-derives the shape)."""
        shape = self.axial_shape or default_axial_shape(self.seq_len)
        dims = self.axial_dims or (self.dim // 4, self.dim - self.dim // 4)
        return tuple(shape), tuple(dims)


class ReformerLM(EffiModel):
    """See the module docstring.

    forward(input_ids (B, T), *, targets (B, T) | None, attention_mask (B, T) | None)
    -> ModelOutput(logits (B, T, V) or None with ``loss_chunk`` and targets, loss,
    hidden (B, T, 2D) after the final LayerNorm, aux, updates).
    """

    def __init__(self, config: ReformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        if c.positions == "axial":
            shape, dims = c.axial
            self.pos: nn.Module = AxialPositions(c.dim, shape, dims, dropout=c.dropout)  # type: ignore[arg-type]
        else:
            self.pos = build_positions(c.positions, c.dim, c.seq_len)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = ReversibleStack(
            [
                ReversibleBlock(
                    c.dim,
                    build_attention(c.attention, self._dims(i)),
                    FeedForward(c.dim, c.ffn_dim, activation=c.activation, dropout=c.dropout),
                    dropout=c.dropout,
                    ffn_chunk=c.ffn_chunk,
                )
                for i in range(c.n_layers)
            ],
            reversible=c.reversible,
        )
        self.final_norm = nn.LayerNorm(2 * c.dim)
        self.out_drop = nn.Dropout(c.dropout)
        self.head = nn.Linear(2 * c.dim, c.vocab_size)
        self._init_weights()

    def _dims(self, layer: int) -> AttentionDims:
        c = self.config
        return AttentionDims(
            c.dim, c.n_heads, c.head_dim, causal=c.causal, dropout=c.attn_dropout,
            residual_dropout=c.dropout, layer=layer, n_layers=c.n_layers, max_len=c.seq_len,
        )  # fmt: skip

    def _init_weights(self) -> None:
        lim = math.sqrt(3.0 / self.config.dim)  # uniform, variance 1 / D
        nn.init.uniform_(self.embed.weight, -lim, lim)
        for name, p in self.named_parameters():
            if name.startswith(("embed.", "pos.")) or "norm" in name:
                continue
            if p.dim() >= 2:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _mask(self, input_ids: Tensor, attention_mask: Tensor | None) -> AttentionMask:
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        kp = None if attention_mask is None else attention_mask.to(torch.bool)
        return AttentionMask(causal=self.config.causal, key_padding=kp)

    def _head(self, h: Tensor) -> Tensor:
        return self.head(self.out_drop(self.final_norm(h)))

    def forward(
        self,
        input_ids: Tensor,
        *,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        state: None = None,
    ) -> ModelOutput:
        if state is not None:
            raise ValueError("the Reformer LM is stateless; pass state=None")
        self.check_input_ids(input_ids)
        mask = self._mask(input_ids, attention_mask)
        x = self.pos(self.drop(self.embed(input_ids)))  # (B, T, D)
        t = input_ids.shape[1]
        ctx = PrepareContext(
            tq=t, tk=t, mask=mask, device=x.device, dtype=x.dtype, training=self.training
        )
        out = self.blocks(x, mask=mask, ctx=ctx)  # hidden (B, T, 2D)
        result = ModelOutput(
            aux=prefix_keys(out.aux, "blocks."), updates=prefix_keys(out.updates, "blocks.")
        )
        if targets is not None:
            self.check_targets(targets, input_ids)
        if targets is not None and self.config.loss_chunk is not None:
            result.loss = chunked_lm_loss(out.hidden, self._head, targets, self.config.loss_chunk)
            return result
        result.hidden = self.final_norm(out.hidden)
        result.logits = self.head(self.out_drop(result.hidden))  # (B, T, V)
        if targets is not None:
            result.loss = lm_loss(result.logits, targets)
        return result


def build_reformer(config: ReformerConfig) -> ReformerLM:
    return ReformerLM(config)


def reconfigure(model: EffiModel, **overrides: Any) -> EffiModel:
    """The same trained model with settings that hold no weights: a new model built from the
    config with ``overrides`` (``n_hashes`` sets every LSH part's hashes, inside patterns too;
    the other keys are :data:`RUNTIME_FIELDS` of the config) and the same state dict (strict).
    Works for any family whose config has an ``attention`` field (a ``vanilla`` model with LSH
    too)::

        eval_model = reconfigure(model, n_hashes=8).eval()
    """
    bad = sorted(set(overrides) - RUNTIME_FIELDS)
    if bad:
        raise ConfigError(
            f"reconfigure changes only settings that hold no weights "
            f"({', '.join(sorted(RUNTIME_FIELDS))}); {', '.join(bad)} would change the weights"
        )
    config = model.config
    over = dict(overrides)
    n_hashes = over.pop("n_hashes", None)
    valid = set(type(config).field_names())
    unknown = sorted(k for k in over if k not in valid)
    if unknown:
        raise ConfigError(f"{type(config).__name__} has no field {', '.join(unknown)}")
    if n_hashes is not None:
        over["attention"] = with_n_hashes(config.attention, n_hashes)
    new = build_model(replace_config(config, **over))
    ref = next(model.parameters())
    new.to(device=ref.device, dtype=ref.dtype)
    new.load_state_dict(model.state_dict(), strict=True)
    new.train(model.training)
    return new


def enwik8_pattern(
    *, lsh_chunk: int = 256, n_hashes: int = 2, n_buckets: int | None = 512, local_chunk: int = 128
) -> PatternConfig:
    """trax's enwik8 attention pattern: [local, local, LSH, local], no biases (trax default)."""
    local = LocalConfig(window=local_chunk, look_backward=1, look_forward=0, bias=False)
    lsh = LSHConfig(chunk_len=lsh_chunk, n_hashes=n_hashes, n_buckets=n_buckets)
    return PatternConfig(layers=(local, local, lsh, local))


register_family(ReformerConfig, build_reformer)
register_recipe("reformer", REFORMER_RECIPE)
register_model(
    "reformer-tiny",
    ReformerConfig(
        dim=64, n_heads=2, n_layers=2, ffn_dim=128, seq_len=128, dropout=0.0,
        attention=LSHConfig(chunk_len=16, n_hashes=2), ffn_chunk=32, loss_chunk=32,
    ),
    "2 reversible layers, d 64, LSH chunk 16 x 2 hashes, axial positions: for tests",
)  # fmt: skip
register_model(
    "reformer-small",
    ReformerConfig(
        dim=256, n_heads=4, n_layers=4, ffn_dim=1024, seq_len=256, dropout=0.1,
        attention=LSHConfig(chunk_len=64, n_hashes=4),
    ),
    "4 reversible layers, d 256, 4 heads, ffn 1024 (vanilla-small's size), LSH chunk 64 x 4 "
    "hashes (the bench shape)",
)  # fmt: skip
register_model(
    "reformer-enwik8",
    ReformerConfig(
        vocab_size=258, dim=1024, n_heads=8, head_dim=64, n_layers=12, ffn_dim=4096,
        seq_len=65536, dropout=0.2, attn_dropout=0.2, attention=enwik8_pattern(),
        axial_shape=(128, 512), axial_dims=(256, 768), ffn_chunk=4096, loss_chunk=4096,
    ),
    "paper/trax enwik8: 12 reversible layers, d 1024, 8x64 heads, d_ff 4096, [local, local, "
    "LSH, local] (LSH chunk 256, 2 hashes, 512 buckets; local chunk 128), axial 128x512, "
    "64K tokens",
)  # fmt: skip
