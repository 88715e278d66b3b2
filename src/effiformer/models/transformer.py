"""Dense Transformer baseline: a decoder-only language model (``causal=True``) and a bidirectional
encoder with a masked-LM head (``causal=False``). Vaswani et al. 2017 (arXiv 1706.03762); pre-LN
option after Xiong et al. 2020 (arXiv 2002.04745). Attention is any registered attention part by
configuration (``attention``; default :class:`~effiformer.attention.dense.DenseConfig`, SDPA), so
every drop-in mechanism (sparse, adaptive span, LSH, routing, ...) runs in this decoder-only LM
and in this bidirectional encoder without code of its own.

Registered: ``vanilla-tiny``, ``vanilla-small``, ``vanilla-base``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..attention import AttentionConfig, AttentionDims, AttentionMask, DenseConfig, PrepareContext
from ..attention.registry import build_attention
from ..config import ModelConfig
from ..layers import FeedForward, LayerStack, TransformerBlock, build_positions, prefix_keys
from ..layers.ffn import ACTIVATIONS
from ..registry import register_family, register_model
from .base import EffiModel, ModelOutput, lm_loss

__all__ = ["VanillaConfig", "Transformer", "build_vanilla"]


@dataclass(frozen=True, kw_only=True)
class VanillaConfig(ModelConfig):
    """Transformer LM / encoder. ``positions``: "learned" (default, GPT-2) or "sinusoidal"
    (Vaswani); ``norm_first``: pre-LN; ``attention``: the attention part of every layer (default
    dense); ``recompute``: recompute each block in the backward pass (activation checkpointing);
    ``embed_dim``: factorised token embeddings of this width (``None``: ``dim``), projected up to
    ``dim`` after the lookup and back down before the (tied) output layer, as the Routing
    Transformer's WikiText-103 model (``embedding_dims`` 256 under ``hidden_size`` 1024)."""

    family = "vanilla"

    norm_first: bool = True
    positions: str = "learned"
    activation: str = "gelu"
    tie_embeddings: bool = True
    attention: AttentionConfig = field(default_factory=DenseConfig)
    recompute: bool = False
    embed_dim: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embed_dim is not None:
            self._check_positive("embed_dim")
        self._check_choice("positions", ("sinusoidal", "learned"))
        self._check_choice("activation", tuple(ACTIVATIONS))
        if self.mem_len != 0:
            raise ValueError("mem_len must be 0 for the dense baseline (it has no memory)")


class Transformer(EffiModel):
    """Token embedding -> positions -> N blocks -> (final LN) -> tied LM head.

    forward(input_ids (B, T), *, targets (B, T) | None, attention_mask (B, T) | None)
    -> ModelOutput(logits (B, T, V), loss, hidden (B, T, D), aux, updates).
    ``attention_mask`` marks real tokens with 1/True (padding 0/False).
    """

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
        self.embed_proj = nn.Linear(e, c.dim) if e != c.dim else nn.Identity()
        self.head_proj = nn.Linear(c.dim, e) if e != c.dim else nn.Identity()
        self.pos = build_positions(c.positions, c.dim, c.seq_len)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = LayerStack(
            [
                TransformerBlock(
                    c.dim,
                    build_attention(c.attention, dims(i)),
                    FeedForward(c.dim, c.ffn_dim, activation=c.activation, dropout=c.dropout),
                    norm_first=c.norm_first,
                    dropout=c.dropout,
                )
                for i in range(c.n_layers)
            ],
            recompute=c.recompute,
        )
        self.final_norm = nn.LayerNorm(c.dim) if c.norm_first else nn.Identity()
        self.head = nn.Linear(e, c.vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings:
            self.head.weight = self.embed.weight

    def _init_weights(self) -> None:
        # With sinusoids, token embeddings have std width^-1/2 and are scaled by sqrt(width) in forward
        # (Vaswani et al. sec. 3.4), so tokens and the unit-amplitude sinusoids enter the first
        # block at the same scale. With learned positions both tables are N(0, 0.02), unscaled
        # (GPT-2).
        sinusoidal = self.config.positions == "sinusoidal"
        for name, p in self.named_parameters():
            if name == "embed.weight" and sinusoidal:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
            elif p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
                if name.endswith(("o_proj.weight", "fc2.weight")):  # GPT-2 residual scaling
                    p.data.mul_(1 / math.sqrt(2 * self.config.n_layers))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _mask(self, input_ids: Tensor, attention_mask: Tensor | None) -> AttentionMask:
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        return AttentionMask(
            causal=self.config.causal,
            key_padding=None if attention_mask is None else attention_mask.to(torch.bool),
        )

    def encode(self, input_ids: Tensor, *, attention_mask: Tensor | None = None) -> ModelOutput:
        """The final hidden states (B, T, D) with the stack's aux losses and updates, without
        the output head (what a sequence classifier on this encoder needs)."""
        self.check_input_ids(input_ids)
        mask = self._mask(input_ids, attention_mask)
        x = self.embed_proj(self.embed(input_ids) * self.embed_scale)  # (B, T, D)
        x = self.drop(self.pos(x))
        t = input_ids.shape[1]
        ctx = PrepareContext(
            tq=t, tk=t, mask=mask, device=x.device, dtype=x.dtype, training=self.training
        )
        out = self.blocks(x, mask=mask, ctx=ctx)
        return ModelOutput(
            hidden=self.final_norm(out.hidden),
            aux=prefix_keys(out.aux, "blocks."),
            updates=prefix_keys(out.updates, "blocks."),
        )

    def forward(
        self,
        input_ids: Tensor,
        *,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        state: None = None,
    ) -> ModelOutput:
        if state is not None:
            raise ValueError(f"{type(self).__name__} is stateless; pass state=None")
        out = self.encode(input_ids, attention_mask=attention_mask)
        out.logits = self.head(self.head_proj(out.hidden))  # (B, T, V)
        if targets is not None:
            self.check_targets(targets, input_ids)
            out.loss = lm_loss(out.logits, targets)
        return out

    def attention_part(self, x: Tensor) -> Tensor:
        mask = AttentionMask(causal=self.config.causal)
        t = x.shape[1]
        ctx = PrepareContext(tq=t, tk=t, mask=mask, device=x.device, dtype=x.dtype, training=True)
        return self.blocks.attention_part(x, mask=mask, ctx=ctx)


def build_vanilla(config: VanillaConfig) -> Transformer:
    return Transformer(config)


register_family(VanillaConfig, build_vanilla)
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
