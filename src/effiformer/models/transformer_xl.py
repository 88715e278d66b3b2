"""Transformer-XL: a causal language model with segment-level recurrence and relative positions.

Dai, Yang, Yang, Carbonell, Le, Salakhutdinov 2019, "Transformer-XL: Attentive Language Models
Beyond a Fixed-Length Context", arXiv 1901.02860.

Implemented:

- Sec. 3.2, segment-level recurrence: for every layer n the memory for the next segment is the
  last ``mem_len`` states of ``concat(memory, input to layer n)``, detached (layer 0's memory holds
  the embeddings after dropout). Queries come from the current segment, keys and values from
  ``concat(memory, segment)``. The memory is an explicit input and output of ``forward``:
  ``forward(input_ids, state=memories)`` returns ``ModelOutput.state`` = the next memories (a tuple
  of n_layers detached (B, M, D) tensors). ``init_state`` returns zero-length memories, as the
  official PyTorch code does, so the first segment sees no memory.
- Sec. 3.3, relative positional attention (:mod:`effiformer.attention.relative_xl`) with the
  shift trick. ``R`` is the [sin | cos] sinusoid over the distances ``klen-1 ... 0``, computed once
  per forward here, clamped at ``clamp_len`` and passed through dropout (``positions``). ``u``/``v``
  are shared across layers (official PyTorch default) or per layer with ``untie_r`` (TF SOTA
  scripts, HF default).
- Sec. 3.3 "complete algorithm": post-LN blocks (``norm_first=False``, default) with a ReLU FFN,
  embeddings scaled by sqrt(dim), dropout on embeddings, R, attention weights (``attn_dropout``,
  ``dropatt``) and every residual branch, and on the last hidden state before the softmax.
- Adaptive input and adaptive softmax (:mod:`effiformer.layers.adaptive`) with ``cutoffs``,
  ``div_val``, tied embeddings and projections, for the word-level corpora.
- ``same_length``: every query sees the same number of keys. We use the **TF convention**
  (``tf/model.py``): a query sees keys at distance ``0 ... mem_len``, i.e. itself plus ``mem_len``
  earlier states, ``mem_len + 1`` keys once the memory is full; the PyTorch code shows one fewer
  (``mem_len`` keys, HF PR #14832). We take TF's because the paper's SOTA numbers come from the TF
  scripts and because it is the window the first query of a full-memory segment already has. The
  window is measured with the configured ``mem_len`` (as the PyTorch code does), so segments that
  start with a short memory still see a full window where one exists.
- Evaluation with a longer memory and shorter segments than training: ``mem_len``, ``seq_len``,
  ``clamp_len``, ``same_length`` and the dropouts change no weights; :func:`reconfigure` builds the
  same model with other values of those fields and loads the same state dict.
- Generation with memory (:meth:`~effiformer.models.base.EffiModel.generate`): the prompt is
  fed as segments, then every new token is a 1-token segment against the memory, so the cost per
  token depends on ``mem_len`` only.

Output: ``ModelOutput(logits, loss, hidden, state, aux={})``. ``loss`` is the mean negative
log-likelihood in nats per target token (targets equal to -100 are ignored). Without adaptive
softmax ``logits`` are (B, T, V). With adaptive softmax the loss is computed from the tails the
targets need and ``logits`` is ``None`` when ``targets`` are given; without targets it is the full
(B, T, V) log-probability tensor (valid logits: their softmax is the model's distribution).

Deviations: no ``ext_len`` (always 0 in the official scripts), so the official ``_update_mems``
argument swap (qlen/mlen, issues #59/#118) cannot arise. With ``norm_first`` a final LayerNorm is
applied after the last block (the official pre-LN variant has none). Separate q/k/v projections
instead of one fused ``qkv_net`` (same function).

Registered: ``xl-tiny``, ``xl-small``, ``xl-enwik8-base``, ``xl-enwik8-large``, ``xl-wt103-base``,
``xl-wt103-large`` (the official ``run_*.sh`` / ``tf/sota/*.sh`` sizes).

**The Adaptive Attention Span model** (Sukhbaatar et al. 2019, arXiv 1905.07799; official
facebookresearch/adaptive-span ``models.py``) is this family with ``attention=adaptive_span``
(:mod:`effiformer.attention.adaptive_span`): its ``TransformerSeq`` is the same recurrence (each
layer caches its detached inputs and attends over ``cache ++ segment``), post-LN blocks with a
ReLU FFN, no absolute positions. Where the two codes differ this config has an option, set in
the ``adaptive-span-*`` entries: ``embed_scale=False`` (a plain ``nn.Embedding``, no sqrt(dim)),
``tie_embeddings=False`` (an untied output layer with a bias), ``emb_dropout=0`` and
``residual_dropout=0`` (the official ``dropout`` acts on the FFN's ReLU and the attention
weights only; ``--emb-dropout`` is 0 in every script), ``init="torch"`` (PyTorch's module
defaults; output biases start at zero rather than uniform), ``mem_len = S`` (the span sizes
each layer's cache down, ``memory_len``). Remaining differences: the memory starts empty rather
than as zeros (see the attention module), and the official optimiser (Adagrad, lr 0.07, linear
warmup, per-parameter step clipping 0.03 inside the optimiser) is the training recipe these
names register (``ADAPTIVE_SPAN_RECIPE``, ``effiformer.optim.AdagradParamClip``), not part of the
model. Registered: ``adaptive-span-tiny``, ``adaptive-span-small``
(``experiments/enwik8_small.sh``), ``adaptive-span-base`` (``enwik8.sh`` / ``text8.sh``),
``adaptive-span-large`` (``enwik8_large.sh``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import AttentionConfig, AttentionDims, AttentionMask, PrepareContext
from ..attention.adaptive_span import AdaptiveSpanConfig
from ..attention.base import keeps_init
from ..attention.registry import build_attention
from ..attention.relative_xl import RelativeXLConfig
from ..config import ConfigError, ModelConfig, replace_config
from ..layers import FeedForward, FIFOMemory, LayerStack, TransformerBlock, prefix_keys
from ..layers.adaptive import AdaptiveInput, AdaptiveLogSoftmax, check_cutoffs
from ..recipes import (
    ADAPTIVE_SPAN_LARGE_RECIPE,
    ADAPTIVE_SPAN_RECIPE,
    ADAPTIVE_SPAN_SMALL_RECIPE,
    XL_RECIPE,
    register_model_recipe,
    register_recipe,
)
from ..registry import build_model, register_family, register_model
from .base import IGNORE_INDEX, EffiModel, ModelOutput, lm_loss

__all__ = ["XLConfig", "TransformerXL", "build_xl", "reconfigure", "RUNTIME_FIELDS"]

#: Config fields that change no weight: a trained model can be rebuilt with other values.
RUNTIME_FIELDS = frozenset(
    {
        "mem_len",
        "seq_len",
        "clamp_len",
        "same_length",
        "dropout",
        "attn_dropout",
        "emb_dropout",
        "residual_dropout",
    }
)


@dataclass(frozen=True, kw_only=True)
class XLConfig(ModelConfig):
    """Transformer-XL.

    ``seq_len``: the segment length (``tgt_len``), the longest input one forward accepts;
    ``mem_len``: memory states per layer; ``clamp_len``: distances above it share one encoding
    (``None``: no clamping); ``same_length``: every query sees ``mem_len + 1`` keys (TF
    convention); ``untie_r``: per-layer u/v; ``norm_first``: pre-LN (default post-LN as in the
    paper); ``adaptive``: adaptive input + softmax with ``cutoffs`` and ``div_val``;
    ``embed_dim``: width of the head cluster's embedding (default ``dim``); ``tie_embeddings``:
    softmax weights are the input embeddings; ``tie_projs``: tail projections shared too;
    ``dropout`` / ``attn_dropout``: ``dropout`` / ``dropatt`` of the official scripts (``dropout``
    is on the FFN's hidden layer, and, unless set apart, on the embeddings, the last hidden
    state and every residual branch); ``emb_dropout``: on the embeddings and the last hidden
    state (None: ``dropout``); ``residual_dropout``: on the attention and FFN outputs before each
    residual sum (None: ``dropout``); ``embed_scale``: embeddings times sqrt(dim) (Transformer-XL;
    off in the adaptive-span code); ``init``: ``"xl"`` (Transformer-XL: N(0, 0.02) block matrices,
    N(0, 0.02) embeddings) or ``"torch"`` (PyTorch's module defaults, as the adaptive-span code:
    kaiming-uniform linears, N(0, 1) embeddings, untied output weights kaiming-uniform, output
    biases zero where ``nn.Linear`` draws them uniformly); ``attention``: the attention part
    (default ``relative_xl``, whose ``untie_r``, ``clamp_len`` and ``same_length`` mirror this
    config's fields of the same names: set them here; other parts ignore those three).
    """

    family = "xl"

    clamp_len: int | None = None
    same_length: bool = False
    untie_r: bool = False
    norm_first: bool = False
    adaptive: bool = False
    cutoffs: tuple[int, ...] = ()
    div_val: int = 1
    embed_dim: int | None = None
    tie_embeddings: bool = True
    tie_projs: bool = True
    embed_scale: bool = True
    emb_dropout: float | None = None
    residual_dropout: float | None = None
    init: str = "xl"
    attention: AttentionConfig = field(default_factory=RelativeXLConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.attention, RelativeXLConfig):
            mirrored = dataclasses.replace(
                self.attention,
                untie_r=self.untie_r,
                clamp_len=self.clamp_len,
                same_length=self.same_length,
            )
            object.__setattr__(self, "attention", mirrored)
        if not self.causal:
            raise ConfigError("causal must be True: Transformer-XL is a causal language model")
        if self.dim % 2:
            raise ConfigError(f"dim must be even for the sinusoid R, got {self.dim}")
        if self.clamp_len is not None and (
            isinstance(self.clamp_len, bool)
            or not isinstance(self.clamp_len, int)
            or self.clamp_len < 0
        ):
            raise ConfigError(f"clamp_len must be None or an int >= 0, got {self.clamp_len!r}")
        if self.same_length and self._window() == 0:
            raise ConfigError("same_length needs mem_len > 0 (each query would see only itself)")
        for name in ("emb_dropout", "residual_dropout"):
            p = getattr(self, name)
            if p is not None and not (isinstance(p, int | float) and 0.0 <= p < 1.0):
                raise ConfigError(f"{name} must be None or in [0, 1), got {p!r}")
        self._check_choice("init", ("xl", "torch"))
        if self.embed_dim is None:
            object.__setattr__(self, "embed_dim", self.dim)
        self._check_positive("embed_dim")
        self._check_positive("div_val")
        object.__setattr__(self, "cutoffs", tuple(self.cutoffs))
        if self.adaptive:
            if not self.cutoffs:
                raise ConfigError("cutoffs must be non-empty when adaptive=True")
            try:
                check_cutoffs(self.cutoffs, self.vocab_size)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if self.embed_dim // self.div_val ** len(self.cutoffs) < 1:
                raise ConfigError(
                    f"div_val={self.div_val} leaves the last cluster no embedding dimensions "
                    f"(embed_dim={self.embed_dim}, {len(self.cutoffs)} tail clusters)"
                )
        elif self.cutoffs or self.div_val != 1:
            raise ConfigError(
                f"cutoffs={self.cutoffs} and div_val={self.div_val} need adaptive=True "
                "(set adaptive=True, or cutoffs=() and div_val=1)"
            )

    def _window(self) -> int:
        """Total memory a query can reach beyond itself (``same_length`` window)."""
        return self.mem_len


class TransformerXL(EffiModel):
    """Adaptive input -> N relative-attention blocks with memory -> adaptive softmax.

    forward(input_ids (B, T), *, targets (B, T) | None, state) -> ModelOutput; ``state`` is the
    tuple of per-layer memories from the previous call (None: :meth:`init_state`).
    """

    def __init__(self, config: XLConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = AdaptiveInput(
            c.vocab_size,
            c.embed_dim,
            c.dim,
            cutoffs=c.cutoffs,
            div_val=c.div_val,
            scale=c.embed_scale,
        )
        self.drop = nn.Dropout(c.dropout if c.emb_dropout is None else c.emb_dropout)
        residual = c.dropout if c.residual_dropout is None else c.residual_dropout
        self.blocks = LayerStack(
            [
                TransformerBlock(
                    c.dim,
                    build_attention(c.attention, self._dims(i)),
                    FeedForward(c.dim, c.ffn_dim, activation="relu", dropout=c.dropout),
                    norm_first=c.norm_first,
                    dropout=residual,
                )
                for i in range(c.n_layers)
            ],
            memory=self._memory_policy(),
        )
        self.final_norm = nn.LayerNorm(c.dim) if c.norm_first else nn.Identity()
        for name, p in self.blocks.named_parameters():
            if c.init != "xl" or "norm" in name or keeps_init(p):
                continue  # "torch": the modules' own defaults; keep_init: the part's own
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        self.softmax = AdaptiveLogSoftmax(
            c.vocab_size,
            c.embed_dim,
            c.dim,
            cutoffs=c.cutoffs,
            div_val=c.div_val,
            tie_to=self.embed if c.tie_embeddings else None,
            tie_projs=c.tie_projs,
        )
        if c.init == "torch":
            # nn.Embedding's N(0, 1); untied output weights as nn.Linear's (kaiming-uniform).
            for e in self.embed.emb_layers:
                nn.init.normal_(e.weight, std=1.0)
            if not c.tie_embeddings:
                for w in self.softmax.weights:
                    nn.init.kaiming_uniform_(w, a=math.sqrt(5))

    def _dims(self, layer: int) -> AttentionDims:
        c = self.config
        return AttentionDims(
            c.dim,
            c.n_heads,
            c.head_dim,
            causal=True,
            dropout=c.attn_dropout,
            residual_dropout=c.dropout,
            layer=layer,
            n_layers=c.n_layers,
            max_len=c.seq_len,
        )

    def _memory_policy(self) -> Any:
        """Segment recurrence: the FIFO memory of sec. 3.2 (Compressive overrides)."""
        return FIFOMemory(self.config.mem_len)

    # ---- state -------------------------------------------------------------------------------

    def _param_dtype(self) -> torch.dtype:
        return next(self.blocks.parameters()).dtype

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """The memory policy's first state: zero-length memories, a tuple of n_layers
        (B, 0, D) tensors (Compressive: zero-filled (memory, compressed memory) pairs)."""
        return self.blocks.init_state(batch_size, self.config.dim, device, self._param_dtype())

    # ---- forward -----------------------------------------------------------------------------

    def _context(self, x: Tensor, tk: int) -> PrepareContext:
        return PrepareContext(
            tq=x.shape[1],
            tk=tk,
            mask=AttentionMask(causal=True),
            device=x.device,
            dtype=x.dtype,
            training=self.training,
            memory_len=self.blocks.memory.window,
        )

    def forward(
        self, input_ids: Tensor, *, targets: Tensor | None = None, state: Any = None
    ) -> ModelOutput:
        self.check_input_ids(input_ids)
        b = input_ids.shape[0]
        x = self.drop(self.embed(input_ids))  # (B, T, D)
        if state is None:
            state = self.init_state(b, x.device)
        else:
            state = self.blocks.check_state(state, b, self.config.dim, x)
        mask = AttentionMask(causal=True)
        out = self.blocks(x, mask=mask, ctx=self._context(x, x.shape[1]), state=state)
        new_state = out.state
        aux = prefix_keys(out.aux, "blocks.")
        updates = prefix_keys(out.updates, "blocks.")
        h = self.final_norm(out.hidden)  # (B, T, D)
        hd = self.drop(h).reshape(-1, h.shape[-1])  # (B*T, D)
        logits = loss = None
        if targets is not None:
            self.check_targets(targets, input_ids)
        if not self.config.adaptive:
            logits = self.softmax.logits(hd).view(*input_ids.shape, -1)  # (B, T, V)
            if targets is not None:
                loss = lm_loss(logits, targets)
        elif targets is None:
            logits = self.softmax.log_prob(hd).view(*input_ids.shape, -1)  # (B, T, V)
        else:
            flat = targets.reshape(-1)
            keep = flat != IGNORE_INDEX
            loss = self.softmax.nll(hd[keep], flat[keep]).mean()
        return ModelOutput(
            logits=logits, loss=loss, hidden=h, state=new_state, aux=aux, updates=updates
        )

    def relative_positions(self, tk: int, ref: Tensor, layer: int = 0) -> Any:
        """What layer ``layer``'s attention is prepared with for ``tk`` keys (the relative_xl
        part: R over the distances tk-1 ... 0, u/v, the same_length window); for tests and
        inspection."""
        ctx = PrepareContext(
            tq=1,
            tk=tk,
            mask=AttentionMask(causal=True),
            device=ref.device,
            dtype=ref.dtype,
            training=self.training,
            memory_len=self.blocks.memory.window,
        )
        return self.blocks[layer].attn.prepare(ctx, self.blocks.shared_for(layer))


def build_xl(config: XLConfig) -> TransformerXL:
    return TransformerXL(config)


def reconfigure(model: TransformerXL, **overrides: Any) -> TransformerXL:
    """The same trained model with other runtime settings: a new model built from
    ``replace_config(model.config, **overrides)`` holding the same weights (strict load).

    Only fields that change no weight are accepted (:data:`RUNTIME_FIELDS`; Compressive adds
    ``cmem_len``), e.g. evaluation with a longer memory and shorter segments::

        eval_model = reconfigure(model, mem_len=1600, seq_len=128, clamp_len=1000,
                                 same_length=True).eval()
    """
    allowed = getattr(type(model), "runtime_fields", RUNTIME_FIELDS)
    bad = sorted(set(overrides) - allowed)
    if bad:
        raise ConfigError(
            f"reconfigure changes only fields that hold no weights ({', '.join(sorted(allowed))});"
            f" {', '.join(bad)} would change the weights: build a new model instead"
        )
    new = build_model(replace_config(model.config, **overrides))
    ref = next(model.parameters())
    new.to(device=ref.device, dtype=ref.dtype)
    new.load_state_dict(model.state_dict(), strict=True)
    new.train(model.training)
    return new


register_family(XLConfig, build_xl)
register_recipe("xl", XL_RECIPE)
register_model_recipe("adaptive-span-*", ADAPTIVE_SPAN_RECIPE)
register_model_recipe("adaptive-span-small", ADAPTIVE_SPAN_SMALL_RECIPE)
register_model_recipe("adaptive-span-large", ADAPTIVE_SPAN_LARGE_RECIPE)

_WT103 = {"vocab_size": 267735, "adaptive": True, "cutoffs": (20000, 40000, 200000)}

register_model(
    "xl-tiny",
    XLConfig(dim=64, n_heads=2, n_layers=2, ffn_dim=128, seq_len=32, mem_len=32, dropout=0.0),
    "2 layers, d 64, byte vocab, tgt = mem = 32: for tests",
)
register_model(
    "xl-small",
    XLConfig(dim=256, n_heads=4, n_layers=4, ffn_dim=1024, seq_len=256, mem_len=256, dropout=0.1),
    "4 layers, d 256, 4 heads, ffn 1024 (vanilla-small size), tgt = mem = 256",
)
register_model(
    "xl-enwik8-base",
    XLConfig(
        dim=512, n_heads=8, head_dim=64, n_layers=12, ffn_dim=2048, seq_len=512, mem_len=512,
        dropout=0.1, attn_dropout=0.0,
    ),
    "run_enwik8_base.sh: 12L d512 8x64 d_inner 2048, tgt = mem = 512 (eval tgt 80 mem 2100 "
    "clamp 820 same_length)",
)  # fmt: skip
register_model(
    "xl-enwik8-large",
    XLConfig(
        dim=1024, n_heads=8, head_dim=128, n_layers=24, ffn_dim=3072, seq_len=768, mem_len=768,
        dropout=0.15, attn_dropout=0.15, untie_r=True,
    ),
    "tf/sota/enwik8.sh: 24L d1024 8x128 d_inner 3072, tgt = mem = 768, dropout 0.15, untie_r",
)  # fmt: skip
register_model(
    "xl-wt103-base",
    XLConfig(
        dim=410, n_heads=10, head_dim=41, n_layers=16, ffn_dim=2100, seq_len=150, mem_len=150,
        dropout=0.1, attn_dropout=0.0, div_val=1, **_WT103,
    ),
    "run_wt103_base.sh: 16L d410 10x41 d_inner 2100, adaptive 20k/40k/200k div_val 1, "
    "tgt = mem = 150",
)  # fmt: skip
register_model(
    "xl-wt103-large",
    XLConfig(
        dim=1024, n_heads=16, head_dim=64, n_layers=18, ffn_dim=4096, seq_len=384, mem_len=384,
        dropout=0.2, attn_dropout=0.2, div_val=4, untie_r=True, **_WT103,
    ),
    "tf/sota/wt103.sh: 18L d1024 16x64 d_inner 4096, adaptive div_val 4, untie_r, "
    "tgt = mem = 384",
)  # fmt: skip

# The adaptive-span code's model (see the module docstring): untied output with bias, unscaled
# embeddings, dropout only on the FFN's ReLU and the attention weights, PyTorch's default init.
_SPAN = {
    "tie_embeddings": False, "embed_scale": False, "emb_dropout": 0.0, "residual_dropout": 0.0,
    "init": "torch",
}  # fmt: skip

register_model(
    "adaptive-span-tiny",
    XLConfig(
        dim=64, n_heads=2, n_layers=2, ffn_dim=128, seq_len=32, mem_len=128, dropout=0.0,
        attention=AdaptiveSpanConfig(max_span=128, ramp=16, trim_step=16, penalty=2e-6), **_SPAN,
    ),
    "2 layers, d 64, block 32, S = 128 (R 16, 16-key trimming): for tests",
)  # fmt: skip
register_model(
    "adaptive-span-small",
    XLConfig(
        dim=256, n_heads=4, n_layers=8, ffn_dim=1024, seq_len=256, mem_len=1024, dropout=0.0,
        attn_dropout=0.0, attention=AdaptiveSpanConfig(max_span=1024, penalty=2e-6), **_SPAN,
    ),
    "experiments/enwik8_small.sh: 8L d256 4 heads d_inner 1024, block 256, S = 1024, "
    "lambda 2e-6, dropout 0",
)  # fmt: skip
register_model(
    "adaptive-span-base",
    XLConfig(
        dim=512, n_heads=8, n_layers=12, ffn_dim=2048, seq_len=512, mem_len=8192, dropout=0.3,
        attn_dropout=0.3, attention=AdaptiveSpanConfig(max_span=8192, penalty=5e-7), **_SPAN,
    ),
    "experiments/enwik8.sh, text8.sh: 12L d512 8 heads d_inner 2048, block 512, S = 8192, "
    "lambda 5e-7, dropout 0.3",
)  # fmt: skip
register_model(
    "adaptive-span-large",
    XLConfig(
        dim=768, n_heads=8, n_layers=24, ffn_dim=4096, seq_len=512, mem_len=8192, dropout=0.4,
        attn_dropout=0.4, attention=AdaptiveSpanConfig(max_span=8192, penalty=5e-7), **_SPAN,
    ),
    "experiments/enwik8_large.sh: 24L d768 8 heads d_inner 4096, block 512, S = 8192, "
    "lambda 5e-7, dropout 0.4",
)  # fmt: skip
