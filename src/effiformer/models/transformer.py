"""Dense Transformer baseline: a decoder-only language model (``causal=True``) and a bidirectional
encoder with a masked-LM head (``causal=False``). Vaswani et al. 2017 (arXiv 1706.03762); pre-LN
option after Xiong et al. 2020 (arXiv 2002.04745). Attention is any registered attention part by
configuration (``attention``; default :class:`~effiformer.attention.dense.DenseConfig`, SDPA), so
every drop-in mechanism (sparse, adaptive span, LSH, routing, ...) runs in this decoder-only LM
and in this bidirectional encoder without code of its own.

Options for the Sparse Transformer's model (Child et al. 2019, arXiv 1904.10509, sections 5.2-5.4)
with its attention part (:mod:`effiformer.attention.sparse`): the pre-LN block is
``norm_first=True`` (the default); ``activation="gelu_sigmoid"`` (x * sigmoid(1.702 x));
``positions="factorized"`` with ``position_stride`` (learned row and column embeddings of a
(T/stride, stride) grid); ``init="sparse_transformer"`` (section 5.3: token embeddings
N(0, 0.125/sqrt(d)), position tables N(0, 0.125/sqrt(d * n_tables)), every other weight matrix
N(0, 0.125/sqrt(d_in)) with d_in its fan-in, read as the standard deviation; W_2 and W_p
(``fc2``, ``o_proj``) scaled by 1/sqrt(2N); biases 0; the output-logit matrix 0, so it must be
untied from the embedding); ``init="lecun"`` (every matrix N(0, 1/sqrt(fan_in)): the quality
suite's small models, see :meth:`Transformer._init_lecun`); ``ffn_dropout=0`` (dropout only at the residual additions);
``recompute=True`` (attention and FFN recomputed in the backward pass).

Registered: ``vanilla-tiny``, ``vanilla-small``, ``vanilla-base``; the Sparse Transformer's
``sparse-tiny``, ``sparse-small`` and ``sparse-enwik8``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import (
    AttentionConfig,
    AttentionDims,
    AttentionMask,
    AttentionPart,
    DenseConfig,
    PrepareContext,
)
from ..attention.base import keeps_init
from ..attention.registry import build_attention
from ..attention.sparse import SparseConfig
from ..config import ConfigError, ModelConfig
from ..layers import FeedForward, LayerStack, TransformerBlock, build_positions, prefix_keys
from ..layers.ffn import ACTIVATIONS, GATED_ACTIVATIONS
from ..recipes import SPARSE_RECIPE, VANILLA_RECIPE, register_model_recipe, register_recipe
from ..registry import register_family, register_model
from .base import EffiModel, ModelOutput, lm_loss, scored_lm_loss

__all__ = ["VanillaConfig", "Transformer", "build_vanilla"]


@dataclass(frozen=True, kw_only=True)
class VanillaConfig(ModelConfig):
    """Transformer LM / encoder. ``positions``: "learned" (default, GPT-2), "sinusoidal"
    (Vaswani) or "factorized" (row and column tables of width ``position_stride``);
    ``norm_first``: pre-LN; ``attention``: the attention part of every layer (default dense);
    ``recompute``: recompute each block in the backward pass (activation checkpointing);
    ``init``: "gpt2" (default: N(0, 0.02), residual projections scaled by 1/sqrt(2N)),
    "sparse_transformer" (see the module docstring) or "lecun" (N(0, 1/sqrt(fan_in))); ``ffn_dropout``: dropout inside the FFN
    (default: ``dropout``); ``embed_dim``: factorised token embeddings of this width (``None``:
    ``dim``), projected up to ``dim`` after the lookup and back down before the (tied) output
    layer, as the Routing Transformer's WikiText-103 model (``embedding_dims`` 256 under
    ``hidden_size`` 1024); ``activation`` also takes the gated ``geglu`` / ``geglu_tanh``
    (:mod:`effiformer.layers.ffn`); ``ffn_bias``: biases in the FFN's linear layers;
    ``positions="none"``: no absolute positions (attention that carries its own, such as the
    Routing Transformer's relative positions). The Routing Transformer's input pipeline
    (``sparse_transformer.py`` ``prepare_decoder``), each off by default: ``token_dropout``
    replaces each input token by ``token_dropout_id`` with that probability in training (its
    ``target_dropout``; the official id 0 is tensor2tensor's padding id; the loss keeps the
    original targets), ``embed_dropout`` drops the token embeddings before ``embed_dense`` (its
    ``dropout``), and ``embed_dense`` projects them by a dense layer with bias even when
    ``embed_dim`` equals ``dim`` (its ``emb_dense``); ``norm_eps``: every LayerNorm's epsilon
    (tensor2tensor's ``norm_epsilon`` is 1e-6)."""

    family = "vanilla"

    norm_first: bool = True
    positions: str = "learned"
    position_stride: int | None = None
    activation: str = "gelu"
    tie_embeddings: bool = True
    attention: AttentionConfig = field(default_factory=DenseConfig)
    recompute: bool = False
    init: str = "gpt2"
    ffn_dropout: float | None = None
    embed_dim: int | None = None
    ffn_bias: bool = True
    token_dropout: float = 0.0
    token_dropout_id: int = 0
    embed_dropout: float = 0.0
    embed_dense: bool = False
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embed_dim is not None:
            self._check_positive("embed_dim")
        self._check_choice("positions", ("sinusoidal", "learned", "factorized", "none"))
        for name in ("token_dropout", "embed_dropout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {v!r}")
        if not 0 <= self.token_dropout_id < self.vocab_size:
            raise ConfigError(
                f"token_dropout_id must be a token id in [0, vocab_size={self.vocab_size}), got "
                f"{self.token_dropout_id!r}"
            )
        if not (isinstance(self.norm_eps, (int, float)) and self.norm_eps > 0):
            raise ConfigError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        self._check_choice("activation", (*ACTIVATIONS, *GATED_ACTIVATIONS))
        self._check_choice("init", ("gpt2", "sparse_transformer", "lecun"))
        if self.mem_len != 0:
            raise ValueError("mem_len must be 0 for the dense baseline (it has no memory)")
        if self.positions == "factorized":
            if self.position_stride is None:
                raise ConfigError("positions='factorized' needs position_stride (the grid width)")
            self._check_positive("position_stride")
        if self.init == "sparse_transformer" and self.tie_embeddings:
            raise ConfigError(
                "init='sparse_transformer' sets the output-logit matrix to 0, so it needs "
                "tie_embeddings=False"
            )
        if self.ffn_dropout is not None and not 0.0 <= self.ffn_dropout < 1.0:
            raise ConfigError(f"ffn_dropout must be in [0, 1), got {self.ffn_dropout}")


class Transformer(EffiModel):
    """Token embedding -> positions -> N blocks -> (final LN) -> tied LM head.

    forward(input_ids (B, T), *, targets (B, T) | None, attention_mask (B, T) | None,
    scored_only) -> ModelOutput(logits (B, T, V), or (N, V) at the N scored targets with
    ``scored_only``; loss, hidden (B, T, D), aux, updates).
    ``attention_mask`` marks real tokens with 1/True (padding 0/False).
    """

    scores_subset = True

    def __init__(self, config: VanillaConfig):
        super().__init__()
        self.config = config
        c = config

        def dims(layer: int) -> AttentionDims:
            return AttentionDims(
                c.dim,
                c.n_heads,
                c.head_dim,
                causal=c.causal,
                dropout=c.attn_dropout,
                residual_dropout=c.dropout,
                layer=layer,
                n_layers=c.n_layers,
                max_len=c.seq_len,
            )

        e = c.dim if c.embed_dim is None else c.embed_dim
        self.embed = nn.Embedding(c.vocab_size, e)
        self.embed_scale = math.sqrt(e) if c.positions == "sinusoidal" else 1.0
        # Factorised embeddings (embed_dim != dim): E -> D after the lookup, D -> E before the head.
        self.embed_proj = nn.Linear(e, c.dim) if e != c.dim or c.embed_dense else nn.Identity()
        self.embed_drop = nn.Dropout(c.embed_dropout)
        self.head_proj = nn.Linear(c.dim, e) if e != c.dim else nn.Identity()
        self.pos = build_positions(c.positions, c.dim, c.seq_len, stride=c.position_stride)
        ffn_dropout = c.dropout if c.ffn_dropout is None else c.ffn_dropout
        self.drop = nn.Dropout(c.dropout)
        self.blocks = LayerStack(
            [
                TransformerBlock(
                    c.dim,
                    build_attention(c.attention, dims(i)),
                    FeedForward(
                        c.dim,
                        c.ffn_dim,
                        activation=c.activation,
                        dropout=ffn_dropout,
                        bias=c.ffn_bias,
                    ),  # fmt: skip
                    norm_first=c.norm_first,
                    dropout=c.dropout,
                    norm_eps=c.norm_eps,
                )
                for i in range(c.n_layers)
            ],
            recompute=c.recompute,
        )
        self.final_norm = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.norm_first else nn.Identity()
        self.head = nn.Linear(e, c.vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings:
            self.head.weight = self.embed.weight

    def _init_weights(self) -> None:
        if self.config.init == "sparse_transformer":
            self._init_sparse_transformer()
            return
        if self.config.init == "lecun":
            self._init_lecun()
            return
        # With sinusoids, token embeddings have std width^-1/2 and are scaled by sqrt(width) in forward
        # (Vaswani et al. sec. 3.4), so tokens and the unit-amplitude sinusoids enter the first
        # block at the same scale. With learned positions both tables are N(0, 0.02), unscaled
        # (GPT-2).
        sinusoidal = self.config.positions == "sinusoidal"
        for name, p in self.named_parameters():
            if keeps_init(p):  # initialised by its attention part (attention.base.keep_init)
                continue
            if name == "embed.weight" and sinusoidal:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
            elif p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
                if name.endswith(("o_proj.weight", "fc2.weight")):  # GPT-2 residual scaling
                    p.data.mul_(1 / math.sqrt(2 * self.config.n_layers))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _init_lecun(self) -> None:
        """LeCun normal: every weight matrix N(0, 1/sqrt(fan_in)) (token and position tables:
        1/sqrt(d)), biases 0, no residual scaling. At small widths GPT-2's fixed 0.02 makes the
        attention logits nearly zero at the start; measured on MQAR (docs/quality.md), a d=64
        model left the copy-a-value plateau after ~2,000 steps with this init and not within
        5,000 with GPT-2's."""
        for name, p in self.named_parameters():
            if keeps_init(p):
                continue
            if p.dim() >= 2:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _init_sparse_transformer(self) -> None:
        """Child et al. 2019, section 5.3 (see the module docstring)."""
        c = self.config
        residual = 1 / math.sqrt(2 * c.n_layers)
        n_tables = getattr(self.pos, "n_tables", 1)
        for name, p in self.named_parameters():
            if name == "embed.weight":
                nn.init.normal_(p, std=0.125 / math.sqrt(c.dim))
            elif name.startswith("pos."):
                nn.init.normal_(p, std=0.125 / math.sqrt(c.dim * n_tables))
            elif name == "head.weight":
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, std=0.125 / math.sqrt(p.shape[1]))
                if name.endswith(("o_proj.weight", "fc2.weight")):
                    p.data.mul_(residual)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def encode(
        self, input_ids: Tensor, *, attention_mask: Tensor | None = None, state: Any = None
    ) -> ModelOutput:
        """The final hidden states (B, T, D) with the stack's aux losses and updates, without
        the output head (what a sequence classifier on this encoder needs). ``state``: per-layer
        decoding caches (:meth:`init_decoding_state`); the new tokens then sit at positions
        ``cache length ...`` and ``attention_mask``, if given, covers cache and new tokens."""
        self.check_input_ids(input_ids)
        b, t = input_ids.shape
        past = 0
        if state is not None:
            state = self.blocks.check_state(state, b, self.config.dim, input_ids)
            past = getattr(state[0], "length", 0)
            if past + t > self.config.seq_len:
                raise ValueError(
                    f"the cache holds {past} tokens and {t} more exceed seq_len="
                    f"{self.config.seq_len}; rebuild the cache from a shorter context"
                )
        if attention_mask is not None and attention_mask.shape != (b, past + t):
            raise ValueError(
                f"attention_mask must be (B={b}, {past + t}) (cache and new tokens), got "
                f"{tuple(attention_mask.shape)}"
            )
        mask = AttentionMask(
            causal=self.config.causal,
            key_padding=None if attention_mask is None else attention_mask.to(torch.bool),
        )
        c = self.config
        if self.training and c.token_dropout > 0:
            drop = torch.rand(input_ids.shape, device=input_ids.device) < c.token_dropout
            input_ids = input_ids.masked_fill(drop, c.token_dropout_id)
        x = self.embed_drop(self.embed(input_ids) * self.embed_scale)
        x = self.embed_proj(x)  # (B, T, D)
        x = self.drop(self.pos(x, offset=past))
        ctx = PrepareContext(
            tq=t, tk=past + t, mask=mask, device=x.device, dtype=x.dtype, training=self.training
        )
        out = self.blocks(x, mask=mask, ctx=ctx, state=state)
        return ModelOutput(
            hidden=self.final_norm(out.hidden),
            state=out.state,
            aux=prefix_keys(out.aux, "blocks."),
            updates=prefix_keys(out.updates, "blocks."),
        )

    def forward(
        self,
        input_ids: Tensor,
        *,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        state: Any = None,
        scored_only: bool = False,
    ) -> ModelOutput:
        out = self.encode(input_ids, attention_mask=attention_mask, state=state)
        if scored_only:
            if targets is None:
                raise ValueError("scored_only=True needs targets (it scores only their positions)")
            self.check_targets(targets, input_ids)
            head = lambda h: self.head(self.head_proj(h))  # noqa: E731
            out.logits, out.loss = scored_lm_loss(out.hidden, head, targets)  # (N, V)
            return out
        out.logits = self.head(self.head_proj(out.hidden))  # (B, T, V)
        if targets is not None:
            self.check_targets(targets, input_ids)
            out.loss = lm_loss(out.logits, targets)
        return out

    def init_decoding_state(self, batch_size: int, device: Any = None) -> Any:
        """Per-layer KV caches when every layer's attention keeps one (dense does), else
        ``None`` (generation then recomputes the window for every token)."""
        attns = [block.attn for block in self.blocks]
        if not self.config.causal or not all(_decodes(a) for a in attns):
            return None
        dtype = next(self.parameters()).dtype
        return tuple(a.init_decoding_state(batch_size, device=device, dtype=dtype) for a in attns)

    def decoding_room(self, state: Any) -> int | None:
        return self.config.seq_len - getattr(state[0], "length", 0)


def _decodes(attn: nn.Module) -> bool:
    """Whether ``attn`` keeps an incremental-decoding state (overrides the base's refusal)."""
    fn = getattr(type(attn), "init_decoding_state", None)
    base = getattr(AttentionPart, "init_decoding_state", None)
    return fn is not None and fn is not base


def build_vanilla(config: VanillaConfig) -> Transformer:
    return Transformer(config)


register_family(VanillaConfig, build_vanilla)
register_recipe("vanilla", VANILLA_RECIPE)
register_model_recipe("sparse-*", SPARSE_RECIPE)
register_model(
    "vanilla-tiny",
    VanillaConfig(dim=64, n_heads=2, n_layers=2, seq_len=128, dropout=0.0),
    "2 layers, d 64: for tests",
)
register_model(
    "vanilla-small",
    VanillaConfig(dim=256, n_heads=4, n_layers=4, seq_len=256, dropout=0.1),
    "4 layers, d 256, 4 heads, ffn 1024",
)
register_model(
    "vanilla-base",
    VanillaConfig(dim=512, n_heads=8, n_layers=12, ffn_dim=2048, seq_len=512, dropout=0.1),
    "12 layers, d 512, 8 heads, ffn 2048 (Transformer-XL enwik8-base size)",
)


# The Sparse Transformer (Child et al. 2019): its block, initialisation, positions and attention.
_SPARSE_MODEL = dict(
    positions="factorized",
    init="sparse_transformer",
    activation="gelu_sigmoid",
    tie_embeddings=False,
    ffn_dropout=0.0,
)
register_model(
    "sparse-tiny",
    VanillaConfig(
        dim=64,
        n_heads=2,
        n_layers=2,
        seq_len=128,
        dropout=0.0,
        position_stride=16,
        attention=SparseConfig(pattern="fixed", stride=16, summary=4, num_verts=2),
        **_SPARSE_MODEL,
    ),
    "2 layers, d 64, fixed pattern l=16, c=4: for tests",
)
register_model(
    "sparse-small",
    VanillaConfig(
        dim=256,
        n_heads=4,
        n_layers=4,
        seq_len=256,
        dropout=0.1,
        position_stride=16,
        attention=SparseConfig(pattern="fixed", stride=16, summary=4, num_verts=4),
        **_SPARSE_MODEL,
    ),
    "vanilla-small's size (4 layers, d 256, 4 heads), fixed l=16 (~sqrt(256)), c=4, 4 sub-blocks",
)
register_model(
    "sparse-enwik8",
    VanillaConfig(
        dim=512,
        n_heads=8,
        n_layers=30,
        seq_len=12288,
        dropout=0.4,
        position_stride=128,
        recompute=True,
        attention=SparseConfig(pattern="fixed", stride=128, summary=32, num_verts=4),
        **_SPARSE_MODEL,
    ),
    "Child et al. 2019 enwik8: 30 layers, d 512, 8 heads, fixed l=128 c=32, merged heads, "
    "context 12,288, dropout 0.4 (95M parameters)",
)
