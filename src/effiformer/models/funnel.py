"""Funnel-Transformer: encoder blocks that pool the sequence, a decoder that upsamples it back.

Dai, Lai, Yang, Le 2020, "Funnel-Transformer: Filtering out Sequential Redundancy for Efficient
Language Processing", arXiv 2006.03236. Implemented: sec. 2.2 (encoder: blocks of post-LN
relative-attention layers; every block after the first starts by mean/max pooling with window =
stride = 2, pool-query-only, separate [CLS], truncate_seq), sec. 2.3 (decoder: upsample the last
block by repetition, add the output of the last layer of block 1, 2 full-length layers), appendix
A.2 (relative attention, :mod:`effiformer.attention.funnel_relative`), parameter sharing "3x2"
(``block_repeats``), and the sec. 4 heads (MLM with tied embeddings, ELECTRA generator +
discriminator, GLUE classification/regression on the encoder only, token classification,
extractive QA, multiple choice). Details follow the official code
(laiguokun/Funnel-Transformer, ``pytorch/modeling.py``, ``pytorch/ops.py``):

- embedding = word embedding -> LayerNorm -> dropout; no absolute positions; LayerNorm eps 1e-9;
  GELU (tanh form) FFN; q without bias, k/v with bias; biases scaled with q.
- pooled side structures are stride-sliced (positions, token types, cls-mask); the
  pooled [CLS] sits at position 1 - 2**b; the pad mask is pooled with the official polarity (a
  slot is padding only when both of its tokens are; HF transformers masks it when either is) --
  see :mod:`effiformer.layers.pooling`.
- pooling stops once the length is <= 2 (<= 1 without ``separate_cls``).

Deliberate deviations:
- The decoder residual is the output of the *last* layer of block 1 (the paper and the official
  code); HF reads ``hidden_states[block_sizes[0]]``, which is a different layer when
  ``block_repeats[0] > 1``.
- When pooling stops early (very short inputs), positions are not advanced for the skipped
  blocks and the decoder upsamples by the stride actually applied; the official code assumes a
  pooling per block in both places. Inputs longer than 2**(n_blocks - 1) + 1 are unaffected.
- The decoder reuses block 1's position table (and its sinusoid dropout draw) instead of drawing
  a fresh one.
- ``token_type_ids=None`` means one segment everywhere; the token-type term is then still added
  (as in HF, which defaults the ids to zeros), it is just the same for every non-[CLS] pair.
- ``n_layers`` is derived: ``sum(block_sizes[i] * block_repeats[i])``, the encoder depth; a
  given value is replaced. Shrink a configuration with ``block_sizes`` (and ``block_repeats``).

Registered: ``funnel-b4-4-4``, ``funnel-b6-6-6``, ``funnel-b6-3x2-3x2``, ``funnel-b8-8-8``,
``funnel-b10-10-10`` and ``funnel-tiny``, each building :class:`FunnelForMaskedLM` (encoder +
decoder + tied MLM head), the base-scale pretraining model.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import AttentionConfig, AttentionDims, AttentionMask, PrepareContext
from ..attention.funnel_relative import FunnelAttentionConfig, FunnelRelativeAttention
from ..attention.registry import build_attention
from ..config import ConfigError, ModelConfig
from ..layers import FeedForward, LayerCall, LayerStack, TransformerBlock, prefix_keys
from ..layers.ffn import ACTIVATIONS
from ..layers.heads import (
    MaskedLMHead,
    ReplacedTokenHead,
    SequenceClassificationHead,
    SpanHead,
    TokenClassificationHead,
    replaced_token_loss,
    sequence_classification_loss,
    span_loss,
    token_classification_loss,
)
from ..layers.pooling import (
    pool_padding,
    pool_positions,
    pool_progression,
    pool_sequence,
    stride_slice,
    upsample,
)
from ..recipes import FUNNEL_RECIPE, register_recipe
from ..registry import register_family, register_model
from .base import IGNORE_INDEX, EffiModel, ModelOutput, lm_loss, register_output
from .classifier import register_classifier

__all__ = [
    "FunnelConfig",
    "FunnelEncoder",
    "FunnelEncoderOutput",
    "FunnelDecoder",
    "FunnelModel",
    "FunnelForMaskedLM",
    "FunnelForSequenceClassification",
    "FunnelForTokenClassification",
    "FunnelForQuestionAnswering",
    "FunnelForMultipleChoice",
    "FunnelElectra",
    "ElectraOutput",
    "CLS_TOKEN_TYPE",
    "build_funnel",
]

logger = logging.getLogger(__name__)

CLS_TOKEN_TYPE = 2  # token type id of [CLS]: the same segment as every token


@dataclass(frozen=True, kw_only=True)
class FunnelConfig(ModelConfig):
    """Funnel-Transformer. Shared fields keep their meaning; ``causal`` must be False.

    block_sizes: distinct layers per block; block_repeats: times each layer is applied (None:
    all 1); n_decoder_layers: full-length layers after upsampling; pooling: "mean" | "max";
    separate_cls, truncate_seq, pool_q_only: see the module docstring; activation_dropout: inside
    the FFN; norm_eps: LayerNorm epsilon; init_std: std of linear layers (None: sqrt(1 /
    (fan_in + fan_out))) and of the embedding (None: 1.0); mlm_transform: dense -> gelu -> LN
    before the tied MLM decoder (False for HF checkpoints); attention: the attention part, default
    ``funnel_relative`` (``attention.kind``: "relative_shift" | "factorized", the official
    ``attention_type``; ``attention.init_range``: U(0, init_range) for its relative parameters).
    """

    family = "funnel"

    vocab_size: int = 30522
    dim: int = 768
    n_heads: int = 12
    seq_len: int = 512
    causal: bool = False
    dropout: float = 0.1
    attn_dropout: float = 0.1
    n_layers: int = 12
    block_sizes: tuple[int, ...] = (4, 4, 4)
    block_repeats: tuple[int, ...] | None = None
    n_decoder_layers: int = 2
    pooling: str = "mean"
    separate_cls: bool = True
    truncate_seq: bool = True
    pool_q_only: bool = True
    activation: str = "gelu_tanh"
    activation_dropout: float = 0.0
    norm_eps: float = 1e-9
    init_std: float | None = None
    mlm_transform: bool = True
    attention: AttentionConfig = field(default_factory=FunnelAttentionConfig)

    def __post_init__(self) -> None:
        sizes = tuple(self.block_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ConfigError(
                f"block_sizes must be a non-empty tuple of positive ints, got {sizes}"
            )
        object.__setattr__(self, "block_sizes", sizes)
        reps = (1,) * len(sizes) if self.block_repeats is None else tuple(self.block_repeats)
        if len(reps) != len(sizes) or any(not isinstance(r, int) or r < 1 for r in reps):
            raise ConfigError(
                f"block_repeats must hold one positive int per block ({len(sizes)}), got {reps}"
            )
        object.__setattr__(self, "block_repeats", reps)
        object.__setattr__(self, "n_layers", sum(s * r for s, r in zip(sizes, reps)))
        super().__post_init__()
        if self.causal:
            raise ConfigError("causal must be False: Funnel-Transformer is a bidirectional encoder")
        if self.mem_len != 0:
            raise ConfigError("mem_len must be 0: Funnel-Transformer has no memory")
        if self.dim % 2:
            raise ConfigError(f"dim must be even (sinusoid of width dim), got {self.dim}")
        if self.n_decoder_layers < 0:
            raise ConfigError(f"n_decoder_layers must be >= 0, got {self.n_decoder_layers}")
        self._check_choice("pooling", ("mean", "max"))
        self._check_choice("activation", tuple(ACTIVATIONS))
        if not 0.0 <= self.activation_dropout < 1.0:
            raise ConfigError(
                f"activation_dropout must be in [0, 1), got {self.activation_dropout}"
            )
        if self.norm_eps <= 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps}")

    @property
    def n_blocks(self) -> int:
        return len(self.block_sizes)


# --------------------------------------------------------------------------- structures


class _Structure:
    """Per-forward positional/segment/padding structures, and how pooling changes them.

    Built once per forward by the encoder; every attention call gets a
    :class:`~effiformer.attention.base.PrepareContext` from it (positions of queries and keys,
    token types, [CLS], one ``scratch`` shared by the whole forward, so the relative-shift
    sinusoid table is drawn once). ``pos``, ``types`` and ``key_padding`` describe the current
    key sequence.
    """

    def __init__(
        self,
        config: FunnelConfig,
        seq_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        training: bool,
        token_types: Tensor | None,
        key_padding: Tensor | None,
    ) -> None:
        self.c = config
        self.seq_len = seq_len
        self.pos = torch.arange(seq_len, device=device)  # (T,) positions
        self.prog = (0, 1, seq_len)  # the same positions as integers: (first, step, count)
        self.types = token_types  # (B, T) token type ids, or None
        self.key_padding = key_padding  # (B, T) bool, True = real token
        self.dtype, self.device, self.training = dtype, device, training
        self.scratch: dict = {}

    def kw(self) -> dict:
        return {"separate_cls": self.c.separate_cls, "truncate_seq": self.c.truncate_seq}

    def context(
        self,
        q_pos: Tensor,
        k_pos: Tensor,
        shift: int,
        q_types: Tensor | None,
        k_types: Tensor | None,
        mask: AttentionMask,
        q_prog: tuple[int, int, int] | None = None,
        k_prog: tuple[int, int, int] | None = None,
    ) -> PrepareContext:
        return PrepareContext(
            tq=q_pos.numel(),
            tk=k_pos.numel(),
            mask=mask,
            device=self.device,
            dtype=self.dtype,
            training=self.training,
            q_positions=q_pos,
            k_positions=k_pos,
            extra={
                "shift": shift,
                "q_types": q_types,
                "k_types": k_types,
                "cls_first": self.c.separate_cls,
                "seq_len": self.seq_len,
                "q_progression": q_prog,
                "k_progression": k_prog,
            },
            scratch=self.scratch,
        )

    def self_context(self, mask: AttentionMask) -> PrepareContext:
        return self.context(
            self.pos, self.pos, 1, self.types, self.types, mask, self.prog, self.prog
        )


# --------------------------------------------------------------------------- encoder / decoder


def _make_layer(c: FunnelConfig, layer: int, n_layers: int) -> TransformerBlock:
    dims = AttentionDims(
        c.dim,
        c.n_heads,
        c.head_dim,
        causal=False,
        dropout=c.attn_dropout,
        residual_dropout=c.dropout,
        layer=layer,
        n_layers=n_layers,
        max_len=c.seq_len,
    )
    attn = build_attention(c.attention, dims)
    ffn = FeedForward(c.dim, c.ffn_dim, activation=c.activation, dropout=c.activation_dropout)
    # Post-LN: LN(x + drop(attn)), LN(x + drop(ffn)); the residual is the (pooled) query.
    return TransformerBlock(
        c.dim, attn, ffn, norm_first=False, dropout=c.dropout, norm_eps=c.norm_eps
    )


@dataclass
class FunnelEncoderOutput:
    """hidden: (B, T_last, D) output of the last block; first_block: (B, T, D) output of the last
    layer of block 1; lengths: sequence length after each block; strides: total pooling stride
    after each block; structure: what the decoder reuses (positions at full length); aux /
    updates: the layers' auxiliary losses and buffer updates, by qualified name relative to the
    encoder."""

    hidden: Tensor
    first_block: Tensor
    lengths: list[int]
    strides: list[int]
    structure: _Structure
    aux: dict[str, Tensor] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)


class FunnelEncoder(nn.Module):
    """Embedding + pooled blocks (one :class:`~effiformer.layers.LayerStack` each).
    forward(input_ids (B, T), attention_mask (B, T) | None, token_type_ids (B, T) | None) ->
    :class:`FunnelEncoderOutput`."""

    def __init__(self, config: FunnelConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.embed_norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.drop = nn.Dropout(c.dropout)
        n, blocks, layer = c.n_layers, [], 0
        for b, size in enumerate(c.block_sizes):
            layers = []
            for _ in range(size):
                layers.append(_make_layer(c, layer, n))
                layer += c.block_repeats[b]
            blocks.append(LayerStack(layers, repeats=(c.block_repeats[b],) * size))
        self.blocks = nn.ModuleList(blocks)

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> FunnelEncoderOutput:
        c = self.config
        x = self.drop(self.embed_norm(self.embed(input_ids)))  # (B, T, D)
        key_padding = None if attention_mask is None else attention_mask.to(torch.bool)
        st = _Structure(
            c,
            x.shape[1],
            dtype=x.dtype,
            device=x.device,
            training=self.training,
            token_types=token_type_ids,
            key_padding=key_padding,
        )
        first_block = x
        lengths, strides, stride = [], [], 1
        aux: dict[str, Tensor] = {}
        updates: dict[str, Tensor] = {}
        for b, stack in enumerate(self.blocks):
            pool = b > 0 and x.shape[1] > (2 if c.separate_cls else 1)
            first = None
            if pool:
                stride *= 2
                kw = st.kw()
                pooled = pool_sequence(x, c.pooling, **kw)  # (B, T', D)
                q_pos = pool_positions(st.pos, int(math.log2(stride)), **kw)
                q_prog = pool_progression(*st.prog, int(math.log2(stride)), **kw)
                q_types = None if st.types is None else stride_slice(st.types, 1, **kw)  # (B, T')
                pooled_padding = pool_padding(st.key_padding, **kw)
                if c.pool_q_only:
                    # First layer: pooled query/residual, unpooled keys and values (shift 2).
                    first_mask = AttentionMask(key_padding=st.key_padding)
                    ctx = st.context(q_pos, st.pos, 2, q_types, st.types, first_mask,
                                     q_prog, st.prog)  # fmt: skip
                    first = LayerCall(kv=x, mask=first_mask, ctx=ctx)
                else:
                    first_mask = AttentionMask(key_padding=pooled_padding)
                    ctx = st.context(q_pos, q_pos, 1, q_types, q_types, first_mask,
                                     q_prog, q_prog)  # fmt: skip
                    first = LayerCall(mask=first_mask, ctx=ctx)
                st.pos, st.types, st.key_padding = q_pos, q_types, pooled_padding
                st.prog = q_prog
                x = pooled
            mask = AttentionMask(key_padding=st.key_padding)
            out = stack(x, mask=mask, ctx=st.self_context(mask), first=first)
            x = out.hidden
            aux.update(prefix_keys(out.aux, f"blocks.{b}."))
            updates.update(prefix_keys(out.updates, f"blocks.{b}."))
            if b == 0:
                first_block = x
                full = copy.copy(st)  # full-length structures, reused by the decoder
            lengths.append(x.shape[1])
            strides.append(stride)
        structure = full if c.n_blocks > 1 else st
        return FunnelEncoderOutput(x, first_block, lengths, strides, structure, aux, updates)


class FunnelDecoder(nn.Module):
    """Upsample + block-1 residual + full-length layers: (B, T', D), (B, T, D) -> (B, T, D)."""

    def __init__(self, config: FunnelConfig) -> None:
        super().__init__()
        self.config = config
        n = config.n_decoder_layers
        self.layers = LayerStack([_make_layer(config, i, n) for i in range(n)])

    def forward(self, enc: FunnelEncoderOutput) -> tuple[Tensor, dict, dict]:
        """-> (hidden (B, T, D), aux, updates)."""
        c = self.config
        t = enc.first_block.shape[1]
        up = upsample(
            enc.hidden, enc.strides[-1], t, separate_cls=c.separate_cls, truncate_seq=c.truncate_seq
        )  # (B, T, D)
        x = up + enc.first_block
        st = enc.structure
        mask = AttentionMask(key_padding=st.key_padding)
        out = self.layers(x, mask=mask, ctx=st.self_context(mask))
        return out.hidden, prefix_keys(out.aux, "layers."), prefix_keys(out.updates, "layers.")


def _init_funnel(module: nn.Module, config: FunnelConfig) -> None:
    """Official initialisation: linear N(0, sqrt(1/(fan_in+fan_out))) or N(0, init_std), zero
    biases; embedding N(0, 1) or N(0, init_std); relative parameters U(0, init_range)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            std = config.init_std
            if std is None:
                std = math.sqrt(1.0 / (m.in_features + m.out_features))
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=1.0 if config.init_std is None else config.init_std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, FunnelRelativeAttention):
            m.reset_relative_parameters()


# --------------------------------------------------------------------------- models


class _FunnelBase(EffiModel):
    """Input checks shared by the Funnel model classes."""

    config: FunnelConfig

    def _check(
        self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None
    ) -> None:
        self.check_input_ids(input_ids)
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and t.shape != input_ids.shape:
                raise ValueError(
                    f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, "
                    f"got {tuple(t.shape)}"
                )
        if token_type_ids is not None and token_type_ids.numel():
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi > CLS_TOKEN_TYPE:
                raise ValueError(
                    f"token_type_ids must be in [0, {CLS_TOKEN_TYPE}] (2 marks [CLS]), got {lo}..{hi}"
                )


class FunnelModel(_FunnelBase):
    """Encoder (+ decoder). forward(input_ids (B, T), *, attention_mask (B, T) | None (1 = real
    token), token_type_ids (B, T) | None) -> ModelOutput(hidden): (B, T, D) with the decoder,
    (B, T_last, D) without (``decoder=False``: the encoder-only model for sequence-level tasks).
    """

    def __init__(self, config: FunnelConfig, *, decoder: bool | None = None) -> None:
        super().__init__()
        self.config = config
        use_decoder = config.n_decoder_layers > 0 if decoder is None else decoder
        if use_decoder and config.n_decoder_layers == 0:
            raise ConfigError("decoder=True needs n_decoder_layers > 0")
        self.encoder = FunnelEncoder(config)
        self.decoder = FunnelDecoder(config) if use_decoder else None
        _init_funnel(self, config)

    @property
    def embed(self) -> nn.Embedding:
        return self.encoder.embed

    def encode(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> FunnelEncoderOutput:
        self._check(input_ids, attention_mask, token_type_ids)
        return self.encoder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        enc = self.encode(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        aux = prefix_keys(enc.aux, "encoder.")
        updates = prefix_keys(enc.updates, "encoder.")
        hidden = enc.hidden
        if self.decoder is not None:
            hidden, d_aux, d_updates = self.decoder(enc)
            aux.update(prefix_keys(d_aux, "decoder."))
            updates.update(prefix_keys(d_updates, "decoder."))
        return ModelOutput(hidden=hidden, aux=aux, updates=updates)


def _carried(out: ModelOutput, inner: ModelOutput, prefix: str) -> ModelOutput:
    """``out`` with ``inner``'s aux losses and updates, their names prefixed by ``prefix``."""
    out.aux.update(prefix_keys(inner.aux, prefix))
    out.updates.update(prefix_keys(inner.updates, prefix))
    return out


class FunnelForMaskedLM(_FunnelBase):
    """Encoder + decoder + MLM head tied to the word embedding (the registered model).

    forward(input_ids (B, T), *, targets (B, T) | None (-100 = not predicted), attention_mask,
    token_type_ids) -> ModelOutput(logits (B, T, V), loss, hidden (B, T, D)).
    """

    def __init__(self, config: FunnelConfig) -> None:
        super().__init__()
        self.config = config
        self.funnel = FunnelModel(config, decoder=config.n_decoder_layers > 0)
        self.head = MaskedLMHead(
            config.dim,
            config.vocab_size,
            transform=config.mlm_transform,
            activation=config.activation,
            norm_eps=config.norm_eps,
        )
        _init_funnel(self.head, config)
        self.head.decoder.weight = self.funnel.embed.weight  # tied

    def forward(
        self,
        input_ids: Tensor,
        *,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        state: None = None,
    ) -> ModelOutput:
        if state is not None:
            raise ValueError("Funnel models are stateless; pass state=None")
        inner = self.funnel(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        h = inner.hidden
        if h.shape[1] != input_ids.shape[1]:
            raise ConfigError("masked LM needs the decoder (n_decoder_layers > 0)")
        logits = self.head(h)  # (B, T, V)
        loss = None
        if targets is not None:
            self.check_targets(targets, input_ids)
            loss = lm_loss(logits, targets)
        return _carried(ModelOutput(logits=logits, loss=loss, hidden=h), inner, "funnel.")

    def sequence_classifier(self, n_labels: int) -> FunnelForSequenceClassification:
        """Encoder-only :class:`FunnelForSequenceClassification` with this model's pretrained
        encoder weights (the decoder and MLM head are dropped, paper sec. 4), fresh head."""
        clf = FunnelForSequenceClassification(self.config, n_labels)
        clf.funnel.encoder.load_state_dict(self.funnel.encoder.state_dict())
        return clf


class _FunnelWithHead(_FunnelBase):
    """A Funnel (encoder only, or with the decoder) and one head on its last hidden state; the
    subclasses choose the decoder, the head and the loss."""

    def __init__(self, config: FunnelConfig, head: nn.Module, *, decoder: bool) -> None:
        super().__init__()
        self.config = config
        self.funnel = FunnelModel(config, decoder=decoder)
        self.head = head
        _init_funnel(self.head, config)

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(
        self,
        input_ids: Tensor,
        *,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        inner = self.funnel(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        h = inner.hidden
        logits = self.head(h)
        loss = None if labels is None else self._loss(logits, labels)
        return _carried(ModelOutput(logits=logits, loss=loss, hidden=h), inner, "funnel.")


class FunnelForSequenceClassification(_FunnelWithHead):
    """Encoder only (paper sec. 4): hidden[:, 0] -> dense + tanh -> dropout -> linear.

    forward(input_ids (B, T), *, labels (B,) | None, attention_mask, token_type_ids)
    -> ModelOutput(logits (B, n_labels), loss, hidden (B, T_last, D)). n_labels=1: regression.
    """

    def __init__(self, config: FunnelConfig, n_labels: int = 2) -> None:
        head = SequenceClassificationHead(config.dim, n_labels, dropout=config.dropout)
        super().__init__(config, head, decoder=False)
        self.n_labels = n_labels

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return sequence_classification_loss(logits, labels)


class FunnelForMultipleChoice(_FunnelBase):
    """Encoder only; one score per choice. forward(input_ids (B, C, T), *, labels (B,) | None,
    attention_mask (B, C, T), token_type_ids (B, C, T)) -> ModelOutput(logits (B, C), loss)."""

    def __init__(self, config: FunnelConfig) -> None:
        super().__init__()
        self.config = config
        self.funnel = FunnelModel(config, decoder=False)
        self.head = SequenceClassificationHead(config.dim, 1, dropout=config.dropout)
        _init_funnel(self.head, config)

    def forward(
        self,
        input_ids: Tensor,
        *,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        if input_ids.dim() != 3:
            raise ValueError(
                f"input_ids must be (batch, choices, seq_len), got {tuple(input_ids.shape)}"
            )
        b, n = input_ids.shape[:2]

        def flat(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.reshape(b * n, -1)  # (B*C, T)

        inner = self.funnel(
            flat(input_ids),
            attention_mask=flat(attention_mask),
            token_type_ids=flat(token_type_ids),
        )
        h = inner.hidden
        logits = self.head(h).view(b, n)  # (B, C)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels.long())
        return _carried(ModelOutput(logits=logits, loss=loss, hidden=h), inner, "funnel.")


class FunnelForTokenClassification(_FunnelWithHead):
    """Encoder + decoder; per-token labels. forward(input_ids (B, T), *, labels (B, T) | None
    (-100 ignored), attention_mask, token_type_ids) -> ModelOutput(logits (B, T, n_labels))."""

    def __init__(self, config: FunnelConfig, n_labels: int = 2) -> None:
        head = TokenClassificationHead(config.dim, n_labels, dropout=config.dropout)
        super().__init__(config, head, decoder=True)
        self.n_labels = n_labels

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return token_classification_loss(logits, labels)


class FunnelForQuestionAnswering(_FunnelBase):
    """Encoder + decoder; extractive spans. forward(input_ids (B, T), *, start_positions (B,),
    end_positions (B,), attention_mask, token_type_ids) -> ModelOutput(logits (B, T, 2) with
    [..., 0] = start and [..., 1] = end logits, loss = mean of the two cross-entropies)."""

    def __init__(self, config: FunnelConfig) -> None:
        super().__init__()
        self.config = config
        self.funnel = FunnelModel(config, decoder=True)
        self.head = SpanHead(config.dim)
        _init_funnel(self.head, config)

    def forward(
        self,
        input_ids: Tensor,
        *,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        inner = self.funnel(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        h = inner.hidden
        start, end = self.head(h)
        loss = None
        if (start_positions is None) != (end_positions is None):
            raise ValueError("pass both start_positions and end_positions, or neither")
        if start_positions is not None:
            loss = span_loss(start, end, start_positions, end_positions)
        out = ModelOutput(logits=torch.stack([start, end], dim=-1), loss=loss, hidden=h)
        return _carried(out, inner, "funnel.")


@register_output
@dataclass
class ElectraOutput(ModelOutput):
    """ModelOutput plus the ELECTRA parts: generator MLM loss, discriminator loss, the corrupted
    input (B, T) and which tokens were replaced (B, T) bool. ``logits`` are the discriminator's."""

    generator_loss: Tensor | None = None
    discriminator_loss: Tensor | None = None
    corrupted: Tensor | None = None
    replaced: Tensor | None = None


class FunnelElectra(_FunnelBase):
    """ELECTRA objective (Clark et al. 2020, arXiv 2003.10555), Funnel's large-scale pretraining.

    A small generator (a :class:`FunnelForMaskedLM` from ``generator_config``) fills the masked
    positions by *sampling* from its output distribution (no gradient through the sample); a
    discriminator (Funnel encoder + decoder + :class:`ReplacedTokenHead`) predicts which tokens
    were replaced. loss = generator MLM loss + ``disc_weight`` (50) * discriminator loss.
    Generator and discriminator share the word embedding (when the generator is narrower its
    embedding output is projected, and its MLM head projects back to the embedding width).

    forward(input_ids (B, T) with [MASK] at the masked positions, *, targets (B, T) original ids
    at the masked positions and -100 elsewhere, attention_mask, token_type_ids, generator
    (torch.Generator for the sampling)) -> :class:`ElectraOutput`.
    """

    def __init__(
        self, config: FunnelConfig, generator_config: FunnelConfig, *, disc_weight: float = 50.0
    ) -> None:
        super().__init__()
        if generator_config.vocab_size != config.vocab_size:
            raise ConfigError("generator_config.vocab_size must equal the discriminator's")
        if generator_config.n_decoder_layers == 0 or config.n_decoder_layers == 0:
            raise ConfigError("ELECTRA needs token-level outputs: n_decoder_layers > 0 for both")
        self.config, self.disc_weight = config, disc_weight
        self.discriminator = FunnelModel(config, decoder=True)
        self.disc_head = ReplacedTokenHead(config.dim, activation=config.activation)
        _init_funnel(self.disc_head, config)
        self.generator = FunnelModel(generator_config, decoder=True)
        g = generator_config.dim
        self.gen_head = MaskedLMHead(
            g,
            config.vocab_size,
            embed_dim=config.dim,
            transform=True,
            activation=config.activation,
            norm_eps=config.norm_eps,
        )
        _init_funnel(self.gen_head, generator_config)
        # Share the embedding: the generator looks up the discriminator's table.
        if g == config.dim:
            self.generator.encoder.embed = self.discriminator.encoder.embed
        else:
            self.generator.encoder.embed = _ProjectedEmbedding(self.discriminator.encoder.embed, g)
        self.gen_head.decoder.weight = self.discriminator.encoder.embed.weight

    def forward(
        self,
        input_ids: Tensor,
        *,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> ElectraOutput:
        self._check(input_ids, attention_mask, token_type_ids)
        if targets is None:
            raise ValueError(
                "FunnelElectra needs targets: original ids at masked positions, -100 elsewhere"
            )
        self.check_targets(targets, input_ids)
        gen = self.generator(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        gen_h = gen.hidden
        gen_logits = self.gen_head(gen_h)  # (B, T, V)
        gen_loss = lm_loss(gen_logits, targets)
        masked = targets != IGNORE_INDEX
        with torch.no_grad():
            probs = torch.softmax(gen_logits[masked].float(), dim=-1)  # (M, V)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            corrupted = input_ids.clone()
            corrupted[masked] = sampled
            original = torch.where(masked, targets, input_ids)
            replaced = corrupted != original
        disc = self.discriminator(
            corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        disc_h = disc.hidden
        disc_logits = self.disc_head(disc_h)  # (B, T)
        disc_loss = replaced_token_loss(disc_logits, replaced, attention_mask)
        loss = gen_loss + self.disc_weight * disc_loss
        out = ElectraOutput(
            logits=disc_logits,
            loss=loss,
            hidden=disc_h,
            generator_loss=gen_loss,
            discriminator_loss=disc_loss,
            corrupted=corrupted,
            replaced=replaced,
        )
        return _carried(_carried(out, gen, "generator."), disc, "discriminator.")

    def sequence_classifier(self, n_labels: int) -> FunnelForSequenceClassification:
        """Encoder-only :class:`FunnelForSequenceClassification` with the discriminator's
        pretrained encoder weights (generator, decoder and heads dropped), fresh head."""
        clf = FunnelForSequenceClassification(self.config, n_labels)
        clf.funnel.encoder.load_state_dict(self.discriminator.encoder.state_dict())
        return clf


class _ProjectedEmbedding(nn.Module):
    """A shared (V, D_disc) embedding followed by a projection to the generator width."""

    def __init__(self, embed: nn.Embedding, dim: int) -> None:
        super().__init__()
        self.shared = embed
        self.proj = nn.Linear(embed.embedding_dim, dim)

    @property
    def weight(self) -> Tensor:
        return self.shared.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.proj(self.shared(ids))


# --------------------------------------------------------------------------- registry


def build_funnel(config: FunnelConfig) -> FunnelForMaskedLM:
    return FunnelForMaskedLM(config)


register_family(FunnelConfig, build_funnel)
register_recipe("funnel", FUNNEL_RECIPE)
register_classifier("funnel", FunnelForSequenceClassification)

_H768 = {"dim": 768, "n_heads": 12, "ffn_dim": 3072}
_H1024 = {"dim": 1024, "n_heads": 16, "ffn_dim": 4096}
register_model(
    "funnel-tiny",
    FunnelConfig(
        vocab_size=1000,
        dim=64,
        n_heads=2,
        ffn_dim=128,
        block_sizes=(1, 1, 1),
        seq_len=128,
        dropout=0.0,
        attn_dropout=0.0,
    ),
    "3 blocks x 1 layer, d 64, 2 heads, vocab 1000: for tests",
)
register_model(
    "funnel-b4-4-4",
    FunnelConfig(block_sizes=(4, 4, 4), **_H768),
    "B4-4-4H768: d 768, 12x64 heads, d_inner 3072, + 2-layer decoder, MLM head",
)
register_model(
    "funnel-b6-6-6",
    FunnelConfig(block_sizes=(6, 6, 6), **_H768),
    "B6-6-6H768: d 768, 12x64 heads, d_inner 3072, + 2-layer decoder, MLM head",
)
register_model(
    "funnel-b6-3x2-3x2",
    FunnelConfig(block_sizes=(6, 3, 3), block_repeats=(1, 2, 2), **_H768),
    "B6-3x2-3x2H768: blocks 2-3 apply 3 layers twice each (shared weights)",
)
register_model(
    "funnel-b8-8-8",
    FunnelConfig(block_sizes=(8, 8, 8), **_H1024),
    "B8-8-8H1024: d 1024, 16x64 heads, d_inner 4096, + 2-layer decoder, MLM head",
)
register_model(
    "funnel-b10-10-10",
    FunnelConfig(block_sizes=(10, 10, 10), **_H1024),
    "B10-10-10H1024: d 1024, 16x64 heads, d_inner 4096, + 2-layer decoder, MLM head",
)
