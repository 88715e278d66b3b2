"""Encoder-decoder Transformer for translation (Vaswani et al. 2017, arXiv 1706.03762).

A new family because no other has an encoder and a decoder with cross-attention between them.
What it implements, by section of the paper:

- sec. 3.1 / fig. 1: an encoder stack (self-attention + FFN) and a decoder stack (causal
  self-attention, cross-attention over the encoder output, FFN), each sub-layer in a residual
  connection followed by LayerNorm (post-LN, ``norm_first=False``, the paper and fairseq's
  ``transformer`` default) or preceded by it (pre-LN, ``norm_first=True``, with a final
  LayerNorm after each stack, as fairseq's ``--encoder-normalize-before``). Both stacks are
  :class:`~effiformer.layers.stack.LayerStack` s; the encoder's blocks are
  :class:`~effiformer.layers.block.TransformerBlock`, the decoder's
  :class:`~effiformer.layers.decoder_block.DecoderBlock`.
- sec. 3.2: the self-attention of either stack is any registered attention part by
  configuration (``attention``, and ``decoder_attention`` for the decoder when it differs);
  cross-attention is dense and full width (:class:`~effiformer.attention.cross.CrossAttention`).
- sec. 3.4: one embedding table for source and target (a joint BPE vocabulary) shared with the
  pre-softmax projection (``share_embeddings``, ``tie_output``; fairseq
  ``--share-all-embeddings``), embeddings multiplied by sqrt(d).
- sec. 3.5: sinusoidal positions (``positions="sinusoidal"``, the [sin | cos] layout fairseq
  uses) or learned ones (``"learned"``); dropout 0.1 on embeddings + positions and on every
  sub-layer output (sec. 5.4).
- sec. 5.4: label-smoothed cross-entropy, epsilon 0.1, in fairseq's formulation (the gold token
  gets ``1 - eps``, every other token ``eps / (V - 1)``), padding ignored: :func:`label_smoothed_nll`.

Initialisation follows fairseq's ``transformer``: Xavier-uniform linear weights (gain 1/sqrt(2)
on the Q/K/V projections), zero biases, embeddings N(0, d^-1/2) with a zero padding row.

Interface (teacher forcing with pre-shifted targets)::

    forward(src_ids (B, S), tgt_in (B, T) | None, *, targets (B, T) | None,
            src_mask (B, S) | None) -> ModelOutput(logits (B, T, V), loss, hidden (B, T, D))

``src_ids`` are the source tokens ending in EOS, right-padded with ``pad_id``; ``tgt_in`` is the
decoder input ``BOS y_1 .. y_{n-1}`` and ``targets`` ``y_1 .. y_{n-1} EOS`` (padding: ``pad_id``
or -100, ignored by the loss). With ``tgt_in=None`` the decoder input is ``targets`` shifted right
behind BOS. ``src_mask`` (True on real tokens) defaults to ``src_ids != pad_id``.

Incremental decoding (explicit state, no module attributes)::

    enc = model.encode(src_ids)                          # EncoderOutput(hidden (B, S, D), mask)
    state = model.init_decoding_state(enc, rows_per_sentence=beam)
    out = model.decode_step(tokens (B*beam, t), state)   # ModelOutput(logits (B*beam, t, V), state)
    state = model.reorder_decoding_state(out.state, index)   # beam search

The state (:class:`DecodingState`) holds per decoder layer the self-attention part's state (what
it returns as ``AttentionOutput.state``: a KVCache for dense attention) and the cross-attention's
projected encoder output (computed once per sentence). ``model.translate(...)`` runs
:mod:`effiformer.generation` (greedy or beam search).

Registered: ``transformer-base``, ``transformer-big`` (sec. 6.1, table 3), ``transformer-iwslt``
(fairseq ``transformer_iwslt_de_en``), ``transformer-multi30k`` (sized for Multi30k on a 2-core
CPU, see docs) and ``seq2seq-tiny``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import AttentionConfig, AttentionDims, AttentionMask, DenseConfig, PrepareContext
from ..attention.cross import CrossAttention
from ..attention.registry import build_attention
from ..config import ConfigError, ModelConfig, attention_config
from ..layers import FeedForward, LayerStack, TransformerBlock, build_positions, prefix_keys
from ..layers.decoder_block import DecoderBlock, DecoderLayerState
from ..layers.ffn import ACTIVATIONS
from ..ops.tracing import can_read_values
from ..recipes import (
    FAIRSEQ_IWSLT_DECODING,
    SEQ2SEQ_RECIPE,
    VASWANI_DECODING,
    register_model_decoding,
    register_recipe,
)
from ..registry import register_family, register_model
from .base import IGNORE_INDEX, EffiModel, ModelOutput

__all__ = [
    "DecodingState",
    "EncoderOutput",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "SourceChecks",
    "build_seq2seq",
    "label_smoothed_nll",
    "shift_right",
]


@dataclass(frozen=True, kw_only=True)
class Seq2SeqConfig(ModelConfig):
    """Encoder-decoder Transformer.

    ``n_layers``: encoder layers; ``decoder_layers``: decoder layers (None: ``n_layers``);
    ``seq_len``: the longest source and the longest decoder input a forward accepts (tokens,
    EOS/BOS included); ``attention``: the self-attention part of the encoder and, unless
    ``decoder_attention`` is given, of the decoder (a config, a registered name or a dict);
    ``positions``: "sinusoidal" or "learned"; ``norm_first``: pre-LN (False: post-LN, the
    paper); ``activation`` / ``activation_dropout``: the FFN's (fairseq ``relu_dropout``);
    ``label_smoothing``: epsilon of the training loss; ``share_embeddings``: one table for source
    and target tokens (a joint vocabulary); ``tie_output``: the output projection is the target
    embedding; ``pad_id`` / ``bos_id`` / ``eos_id``: the special tokens (those of
    :class:`~effiformer.data.tokenizer.SubwordTokenizer`: [PAD]=0, [CLS]=2 as BOS, [SEP]=3 as
    EOS). ``causal`` and ``mem_len`` are fixed (the decoder is causal, the encoder is not; no
    memory).
    """

    family = "seq2seq"

    vocab_size: int = 8000
    dim: int = 512
    n_heads: int = 8
    n_layers: int = 6
    ffn_dim: int | None = 2048
    seq_len: int = 256
    decoder_layers: int | None = None
    attention: AttentionConfig = field(default_factory=DenseConfig)
    decoder_attention: AttentionConfig | str | None = None
    positions: str = "sinusoidal"
    norm_first: bool = False
    activation: str = "relu"
    activation_dropout: float = 0.0
    label_smoothing: float = 0.1
    share_embeddings: bool = True
    tie_output: bool = True
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decoder_attention is not None and not isinstance(
            self.decoder_attention, AttentionConfig
        ):
            value = self.decoder_attention
            if isinstance(value, dict) and "name" not in value:
                value = {"name": self.attention.name, **value}
            object.__setattr__(self, "decoder_attention", attention_config(value))
        if self.decoder_layers is None:
            object.__setattr__(self, "decoder_layers", self.n_layers)
        self._check_positive("decoder_layers")
        self._check_choice("positions", ("sinusoidal", "learned"))
        self._check_choice("activation", tuple(ACTIVATIONS))
        if not self.causal:
            raise ConfigError(
                "causal must stay True for seq2seq (the decoder is causal and the encoder "
                "bidirectional by construction)"
            )
        if self.mem_len != 0:
            raise ConfigError("mem_len must be 0 for seq2seq (it has no recurrent memory)")
        if not 0.0 <= self.activation_dropout < 1.0:
            raise ConfigError(
                f"activation_dropout must be in [0, 1), got {self.activation_dropout}"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for name, value in ids.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int, got {value!r}")
            if not 0 <= value < self.vocab_size:
                raise ConfigError(
                    f"{name}={value} is outside the vocabulary [0, {self.vocab_size})"
                )
        if len(set(ids.values())) != 3:
            raise ConfigError(f"pad_id, bos_id and eos_id must differ, got {ids}")
        if self.positions == "sinusoidal" and self.dim % 2:
            raise ConfigError(f"sinusoidal positions need an even dim, got dim={self.dim}")

    @property
    def decoder_self_attention(self) -> AttentionConfig:
        return self.decoder_attention if self.decoder_attention is not None else self.attention

    @property
    def attention_causal(self) -> bool:
        """``attention`` is the encoder's (bidirectional); the decoder's is causal."""
        return False


@dataclass(frozen=True)
class EncoderOutput:
    """hidden: (B, S, D) encoder output; mask: (B, S) bool, True on real source tokens (None:
    no padding)."""

    hidden: Tensor
    mask: Tensor | None


@dataclass(frozen=True)
class DecodingState:
    """Incremental decoding state of :class:`Seq2SeqTransformer`.

    layers: one :class:`~effiformer.layers.decoder_block.DecoderLayerState` per decoder layer;
    memory_mask: (B, S) source padding (None: none); length: target positions fed so far (the
    position of the next token); rows: decoder rows R (``R // B`` per sentence, sentence-major).
    """

    layers: tuple[DecoderLayerState, ...]
    memory_mask: Tensor | None
    length: int
    rows: int


def shift_right(targets: Tensor, bos_id: int, pad_id: int) -> Tensor:
    """Decoder input for ``targets`` (B, T): ``BOS t_1 .. t_{T-1}``, with -100 turned into pad."""
    shifted = targets.new_full(targets.shape, pad_id)
    shifted[:, 0] = bos_id
    shifted[:, 1:] = targets[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_id)


def label_smoothed_nll(
    logits: Tensor,
    targets: Tensor,
    epsilon: float,
    *,
    ignore: Sequence[int] = (IGNORE_INDEX,),
    with_nll: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Label-smoothed cross-entropy in fairseq's formulation (and the plain NLL on request).

    logits (..., V), targets (...): per target ``(1 - eps - eps/(V-1)) * nll + eps/(V-1) *
    sum_v -log p_v``, i.e. cross-entropy against ``1 - eps`` on the gold token and ``eps/(V-1)``
    on each other one (fairseq ``label_smoothed_nll_loss``). Targets equal to any of ``ignore``
    are left out. Returns ``(loss, nll)``: means over the counted targets, in nats; ``nll`` is
    None unless ``with_nll``. The loss equals ``F.cross_entropy(label_smoothing=eps * V /
    (V - 1))`` (PyTorch spreads its epsilon over all V classes), which is what computes it.
    """
    v = logits.shape[-1]
    flat_logits = logits.reshape(-1, v).float()
    flat = targets.reshape(-1)
    ignored = torch.zeros_like(flat, dtype=torch.bool)
    for i in ignore:
        ignored |= flat == i
    flat = flat.masked_fill(ignored, IGNORE_INDEX)
    smoothing = min(epsilon * v / (v - 1), 1.0) if v > 1 else 0.0
    loss = F.cross_entropy(flat_logits, flat, ignore_index=IGNORE_INDEX, label_smoothing=smoothing)
    nll = None
    if with_nll:
        if epsilon == 0.0:
            nll = loss.detach()
        else:
            with torch.no_grad():
                nll = F.cross_entropy(flat_logits, flat, ignore_index=IGNORE_INDEX)
    return loss, nll


class SourceChecks:
    """Input checks shared by the encoder-decoder models (this family and HAT's
    SuperTransformer): token ids named in errors, and the source padding mask."""

    config: Any

    def _check_ids(self, ids: Tensor, name: str) -> None:
        try:
            self.check_input_ids(ids)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{name}: {e}") from None

    def _source_mask(self, src_ids: Tensor, src_mask: Tensor | None) -> Tensor | None:
        if src_mask is None:
            mask = src_ids != self.config.pad_id
        else:
            if src_mask.shape != src_ids.shape:
                raise ValueError(
                    f"src_mask must have the shape of src_ids {tuple(src_ids.shape)}, "
                    f"got {tuple(src_mask.shape)}"
                )
            mask = src_mask.to(torch.bool)
        if not can_read_values(mask):  # traced or on CUDA: no check, the general path
            return mask
        if not bool(mask.any(dim=1).all()):
            raise ValueError("every source row needs at least one real token (an EOS at least)")
        return None if bool(mask.all()) else mask


class Seq2SeqTransformer(SourceChecks, EffiModel):
    """Embeddings -> encoder stack; embeddings -> decoder stack (cross-attending to the encoder
    output) -> tied output projection. See the module docstring for the interface."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        c = config

        def dims(layer: int, n: int, causal: bool) -> AttentionDims:
            return AttentionDims(
                c.dim,
                c.n_heads,
                c.head_dim,
                causal=causal,
                dropout=c.attn_dropout,
                residual_dropout=c.dropout,
                layer=layer,
                n_layers=n,
                max_len=c.seq_len,
            )

        def ffn() -> FeedForward:
            return FeedForward(
                c.dim, c.ffn_dim, activation=c.activation, dropout=c.activation_dropout
            )

        self.embed = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_id)
        self.src_embed = (
            self.embed
            if c.share_embeddings
            else nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_id)
        )
        self.embed_scale = math.sqrt(c.dim)
        self.src_pos = build_positions(c.positions, c.dim, c.seq_len)
        self.tgt_pos = build_positions(c.positions, c.dim, c.seq_len)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = LayerStack(
            [
                TransformerBlock(
                    c.dim,
                    build_attention(c.attention, dims(i, c.n_layers, False)),
                    ffn(),
                    norm_first=c.norm_first,
                    dropout=c.dropout,
                )
                for i in range(c.n_layers)
            ]
        )
        self.decoder = LayerStack(
            [
                DecoderBlock(
                    c.dim,
                    build_attention(c.decoder_self_attention, dims(i, c.decoder_layers, True)),
                    CrossAttention(c.dim, c.n_heads, c.head_dim, dropout=c.attn_dropout),
                    ffn(),
                    norm_first=c.norm_first,
                    dropout=c.dropout,
                )
                for i in range(c.decoder_layers)
            ]
        )
        self.encoder_norm = nn.LayerNorm(c.dim) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.dim) if c.norm_first else nn.Identity()
        self.head = nn.Linear(c.dim, c.vocab_size, bias=False)
        self._init_weights()
        if c.tie_output:
            self.head.weight = self.embed.weight

    def _init_weights(self) -> None:
        d = self.config.dim
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                qkv = name.endswith(("q_proj", "k_proj", "v_proj"))
                nn.init.xavier_uniform_(m.weight, gain=1 / math.sqrt(2) if qkv else 1.0)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=d**-0.5)
                if m.padding_idx is not None:
                    with torch.no_grad():
                        m.weight[m.padding_idx].zero_()
        for pos in (self.src_pos, self.tgt_pos):
            table = getattr(pos, "table", None)
            if table is not None:
                nn.init.normal_(table.weight, std=d**-0.5)

    # ---- encoder and decoder ---------------------------------------------------------------

    def encode(self, src_ids: Tensor, *, src_mask: Tensor | None = None) -> EncoderOutput:
        """src_ids (B, S) -> :class:`EncoderOutput` (hidden (B, S, D), mask (B, S) or None)."""
        out, _, _ = self._encode(src_ids, src_mask)
        return out

    def _encode(self, src_ids: Tensor, src_mask: Tensor | None):
        self._check_ids(src_ids, "src_ids")
        mask = self._source_mask(src_ids, src_mask)
        x = self.drop(self.src_pos(self.src_embed(src_ids) * self.embed_scale))  # (B, S, D)
        amask = AttentionMask(causal=False, key_padding=mask)
        s = src_ids.shape[1]
        ctx = PrepareContext(
            tq=s, tk=s, mask=amask, device=x.device, dtype=x.dtype, training=self.training
        )
        out = self.encoder(x, mask=amask, ctx=ctx)
        enc = EncoderOutput(hidden=self.encoder_norm(out.hidden), mask=mask)
        return enc, prefix_keys(out.aux, "encoder."), prefix_keys(out.updates, "encoder.")

    def _decode(
        self, tgt_in: Tensor, enc: EncoderOutput | None, state: DecodingState | None
    ) -> ModelOutput:
        offset = 0 if state is None else state.length
        limit = self.config.seq_len
        if offset + tgt_in.shape[1] > limit:
            raise ValueError(
                f"decoder positions up to {offset + tgt_in.shape[1]} exceed the model's limit "
                f"seq_len={limit}"
            )
        self._check_ids(tgt_in, "tgt_in")
        x = self.drop(self.tgt_pos(self.embed(tgt_in) * self.embed_scale, offset))  # (R, T, D)
        t = tgt_in.shape[1]
        amask = AttentionMask(causal=True)
        ctx = PrepareContext(
            tq=t,
            tk=offset + t,
            mask=amask,
            device=x.device,
            dtype=x.dtype,
            training=self.training,
            q_positions=torch.arange(offset, offset + t, device=x.device),
            k_positions=torch.arange(offset + t, device=x.device),
        )
        if state is None:
            kwargs = {"memory": enc.hidden, "memory_mask": enc.mask}
            out = self.decoder(x, mask=amask, ctx=ctx, block_kwargs=kwargs)
            new_state = None
        else:
            if tgt_in.shape[0] != state.rows:
                raise ValueError(
                    f"tokens have {tgt_in.shape[0]} rows but the decoding state has {state.rows}"
                )
            kwargs = {"memory_mask": state.memory_mask}
            out = self.decoder(x, mask=amask, ctx=ctx, state=state.layers, block_kwargs=kwargs)
            new_state = DecodingState(
                layers=tuple(out.state),
                memory_mask=state.memory_mask,
                length=offset + t,
                rows=state.rows,
            )
        hidden = self.decoder_norm(out.hidden)
        return ModelOutput(
            logits=self.head(hidden),  # (R, T, V)
            hidden=hidden,
            state=new_state,
            aux=prefix_keys(out.aux, "decoder."),
            updates=prefix_keys(out.updates, "decoder."),
        )

    def decode(self, tgt_in: Tensor, enc: EncoderOutput) -> ModelOutput:
        """Teacher-forced decoder over the whole ``tgt_in`` (B, T) -> logits (B, T, V)."""
        return self._decode(tgt_in, enc, None)

    def forward(
        self,
        src_ids: Tensor,
        tgt_in: Tensor | None = None,
        *,
        targets: Tensor | None = None,
        src_mask: Tensor | None = None,
        state: None = None,
    ) -> ModelOutput:
        """Teacher forcing; see the module docstring. ``loss``: label-smoothed cross-entropy
        (``config.label_smoothing``), mean nats per non-padding target."""
        if state is not None:
            raise ValueError(
                "forward is teacher forcing and takes no state; decode incrementally with "
                "init_decoding_state() and decode_step()"
            )
        if tgt_in is None:
            if targets is None:
                raise ValueError("give tgt_in (the decoder input) or targets (to shift right)")
            tgt_in = shift_right(targets, self.config.bos_id, self.config.pad_id)
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src_ids.shape[0]:
            raise ValueError(f"tgt_in must be (B={src_ids.shape[0]}, T), got {tuple(tgt_in.shape)}")
        enc, aux, updates = self._encode(src_ids, src_mask)
        out = self._decode(tgt_in, enc, None)
        out.aux = {**aux, **out.aux}
        out.updates = {**updates, **out.updates}
        if targets is not None:
            self.check_targets(targets, tgt_in)
            out.loss, _ = label_smoothed_nll(
                out.logits,
                targets,
                self.config.label_smoothing,
                ignore=(IGNORE_INDEX, self.config.pad_id),
            )
        return out

    # ---- incremental decoding --------------------------------------------------------------

    def init_decoding_state(
        self, enc: EncoderOutput, *, rows_per_sentence: int = 1
    ) -> DecodingState:
        """The state before the first decoder token: every layer's cross-attention keys and
        values projected from ``enc.hidden`` (once per sentence) and its self-attention's empty
        state for ``B * rows_per_sentence`` rows."""
        if isinstance(rows_per_sentence, bool) or rows_per_sentence < 1:
            raise ValueError(f"rows_per_sentence must be >= 1, got {rows_per_sentence!r}")
        rows = enc.hidden.shape[0] * rows_per_sentence
        layers = tuple(block.init_state(enc.hidden, rows) for block in self.decoder)
        return DecodingState(layers=layers, memory_mask=enc.mask, length=0, rows=rows)

    def decode_step(self, tokens: Tensor, state: DecodingState) -> ModelOutput:
        """Feed ``tokens`` (R, t) (usually t = 1) after everything ``state`` has seen ->
        ModelOutput(logits (R, t, V), state: the next :class:`DecodingState`)."""
        if not isinstance(state, DecodingState):
            raise TypeError(f"state must be a DecodingState, got {type(state).__name__}")
        return self._decode(tokens, None, state)

    def reorder_decoding_state(self, state: DecodingState, index: Tensor) -> DecodingState:
        """Rows ``index`` (R,) of ``state``, each taken from a row of the same sentence (beam
        search keeps a sentence's best continuations among its own rows)."""
        g = state.rows // (state.layers[0].cross.k.shape[0] if state.layers else 1)
        if index.dim() != 1 or index.shape[0] != state.rows:
            raise ValueError(f"index must be ({state.rows},), got {tuple(index.shape)}")
        home = torch.arange(state.rows, device=index.device) // g
        if not torch.equal(index // g, home):
            raise ValueError("reorder index moves rows across sentences")
        layers = tuple(b.reorder_state(s, index) for b, s in zip(self.decoder, state.layers))
        return DecodingState(layers, state.memory_mask, state.length, state.rows)

    # ---- generation ------------------------------------------------------------------------

    def translate(
        self,
        sources: Sequence[str] | Sequence[Sequence[int]] | Tensor,
        *,
        tokenizer: Any = None,
        beam: int = 5,
        lenpen: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
        batch_size: int = 64,
    ) -> list[str] | list[list[int]]:
        """Translate ``sources``: strings (with ``tokenizer``, a
        :class:`~effiformer.data.tokenizer.SubwordTokenizer`) or token ids (lists ending in EOS,
        or a padded (B, S) tensor). Returns strings or id lists (without BOS/EOS), in order.
        ``beam=1`` is greedy search; see :func:`effiformer.generation.beam_search`."""
        from ..generation import translate

        return translate(
            self,
            sources,
            tokenizer=tokenizer,
            beam=beam,
            lenpen=lenpen,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            batch_size=batch_size,
        )


def build_seq2seq(config: Seq2SeqConfig) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(config)


register_family(Seq2SeqConfig, build_seq2seq)
register_recipe("seq2seq", SEQ2SEQ_RECIPE)
register_model_decoding("transformer-base", VASWANI_DECODING)
register_model_decoding("transformer-big", VASWANI_DECODING)
register_model_decoding("transformer-iwslt", FAIRSEQ_IWSLT_DECODING)
register_model(
    "seq2seq-tiny",
    Seq2SeqConfig(
        vocab_size=256, dim=32, n_heads=2, n_layers=2, ffn_dim=64, seq_len=64, dropout=0.0
    ),
    "2+2 layers, d 32: for tests",
)
register_model(
    "transformer-base",
    Seq2SeqConfig(vocab_size=37000, dim=512, n_heads=8, n_layers=6, ffn_dim=2048, seq_len=1024),
    "Vaswani et al. base: 6+6 layers, d 512, 8 heads, FFN 2048, dropout 0.1, 37k joint BPE",
)
register_model(
    "transformer-big",
    Seq2SeqConfig(
        vocab_size=37000, dim=1024, n_heads=16, n_layers=6, ffn_dim=4096, seq_len=1024, dropout=0.3
    ),
    "Vaswani et al. big: 6+6 layers, d 1024, 16 heads, FFN 4096, dropout 0.3 (En-De)",
)
register_model(
    "transformer-iwslt",
    Seq2SeqConfig(
        vocab_size=10000, dim=512, n_heads=4, n_layers=6, ffn_dim=1024, seq_len=1024, dropout=0.3
    ),
    "fairseq transformer_iwslt_de_en: 6+6 layers, d 512, 4 heads, FFN 1024, dropout 0.3",
)
register_model(
    "transformer-multi30k",
    Seq2SeqConfig(
        vocab_size=8000, dim=256, n_heads=4, n_layers=3, ffn_dim=1024, seq_len=128, dropout=0.1
    ),
    "3+3 layers, d 256, 4 heads, FFN 1024: Multi30k on a 2-core CPU (sized by steps/s)",
)
