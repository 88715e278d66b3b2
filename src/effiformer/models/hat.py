"""HAT's weight-sharing SuperTransformer (Wang et al., ACL 2020, arXiv 2005.14187).

"HAT: Hardware-Aware Transformers for Efficient Natural Language Processing". A new family
because its model has structure no other family has: every layer runs at a width chosen per
forward (a *SubTransformer*), and each decoder layer may attend to several encoder layers.
What it implements, by section of the paper and file of the official code
(``mit-han-lab/hardware-aware-transformers``):

- sec. 3.1, "SuperTransformer" (``fairseq/models/transformer_super.py``,
  ``fairseq/modules/{linear,embedding,multihead_attention}_super.py``, ``layer_norm.py``): one
  post-LN encoder-decoder Transformer at the largest widths; a SubTransformer takes the **front
  slices** of every weight: a linear layer ``W[:out, :in]`` and ``bias[:out]``, LayerNorm
  ``weight[:d]``, ``bias[:d]``, the embedding table ``E[:, :d]`` (the tied output projection too),
  and the first ``d`` columns of the sinusoid table of the *largest* width. The Q/K/V width
  stays ``qkv_dim`` (512 in the WMT space) whatever ``d`` is, so the Q/K/V projections slice
  only their input columns and their bias is never sliced; a head count changes the head size
  (``qkv_dim / heads``) and with it the softmax scaling. Layers past the sampled depth are the
  identity (they are skipped). Embeddings are scaled by ``sqrt(d_sampled)``; dropout (and the
  FFN's activation dropout) is rescaled to ``p * d_sampled / d_super``; attention-weight dropout
  is not (``calc_dropout``).
- sec. 3.1, "arbitrary encoder-decoder attention": decoder layer ``j`` attends to the outputs of
  the last ``attend[j]`` (1, 2 or 3) encoder layers, **concatenated along time** (last first, as
  the official ``torch.cat([out, out_all[-2], out_all[-3]], dim=0)``), with the source padding
  mask tiled to match (``mask.repeat(1, m)``). The official code encodes the choice as -1 / 1 / 2
  (``decoder_arbitrary_ende_attn``); here it is the number of layers, 1 / 2 / 3
  (:meth:`SubTransformer.from_hat` converts).
- the design spaces of ``configs/*/supertransformer/space{0,1}.yml`` as data
  (:data:`WMT_SPACE`, :data:`IWSLT_SPACE`), a Multi30k-sized one and a tiny one for tests; the
  wider spaces the latency datasets were sampled from (``configs/*/latency_dataset/*.yml``: FFN
  widths and head counts extended downwards) in :data:`LATENCY_SPACES`; the released WMT'14
  En-De SubTransformers (``configs/wmt14.en-de/subtransformer/HAT_*.yml``) with the figures of
  the repository's README in :data:`RELEASED_WMT14_ENDE`.

The SubTransformer is an **explicit argument** (``sample=``) of :meth:`SuperTransformer.forward`
and :meth:`~SuperTransformer.encode`; the encoder output and the decoding state carry it on to
the decoder, so nothing is set on a module before a call (the official code's
``set_sample_config`` is replaced by arguments). ``sample=None`` is the model's own architecture
(the largest SubTransformer of a SuperTransformer). :meth:`SuperTransformer.bind` gives a
:class:`SubTransformerView`, a model-shaped view with the sample fixed, which every caller of the
seq2seq interface takes as it is (:mod:`effiformer.generation`'s beam search,
:class:`~effiformer.tasks.translation.TranslationTask`, :func:`effiformer.bench.decoding.
decoding_latency`). :func:`export_subtransformer` builds a standalone model of the
SubTransformer's own size (a :class:`HATConfig` with ``sub=``), holding only its slices: saved
with :func:`effiformer.save_model`, reloaded with :func:`effiformer.load_model` or built fresh
through the registry (``create_model("hat-multi30k-super", sub=...)``) to train from scratch.

Interface (as :class:`~effiformer.models.seq2seq.Seq2SeqTransformer`)::

    forward(src_ids (B, S), tgt_in (B, T) | None, *, targets (B, T) | None,
            src_mask (B, S) | None, sample: SubTransformer | None) -> ModelOutput(logits (B, T, V))
    enc = model.encode(src_ids, sample=sub)         # HATEncoderOutput (per-layer outputs, mask)
    state = model.init_decoding_state(enc, rows_per_sentence=beam)
    out = model.decode_step(tokens (R, t), state)  # ModelOutput(logits (R, t, V), state)
    state = model.reorder_decoding_state(out.state, index)

The space (:class:`SubTransformer`, :class:`DesignSpace`, the released configurations) is data
in :mod:`effiformer.models.hat_space`, re-exported here. Why the network does not use the
attention interface (:class:`~effiformer.attention.base.AttentionPart`) and
:class:`~effiformer.layers.stack.LayerStack`: those are built for one architecture, their
projections, prepared plans and decoding states sized when the model is built, while a
SuperTransformer changes every layer's width, head count (hence head size and softmax scale),
FFN width and depth per forward by reading front slices of its weights (:class:`SlicedLinear`);
an attention part per sampled shape would mean a new module per SubTransformer, and weight
sharing across them is the method. What is shared is below the layer: the attention itself is
:func:`~effiformer.attention.dense.sdpa`, the caches are :class:`~effiformer.attention.base.KVCache`,
and a standalone SubTransformer runs the same code at fixed sizes.

Deliberate deviations from the official code:

- the official encoder layer drops out its *self-attention* output with the un-rescaled ``p``
  (``self.dropout``) while every other residual dropout is rescaled; here every residual dropout
  is rescaled, as the paper describes;
- "the last m encoder layers" are the last m *active* layers (the official code indexes the
  super depth's outputs, which only differs when the encoder depth varies; no released space
  varies it);
- the sinusoid table is the project's (:func:`~effiformer.attention.sinusoid.sinusoid_table`,
  ``[sin | cos]`` with frequencies ``10000^(-2k/d)``, positions from 0) rather than fairseq's
  (``10000^(-k/(d/2-1))``, positions from ``pad + 1``), as in the ``seq2seq`` family; it is sliced
  as HAT slices its table;
- Q/K/V are one fused projection for self-attention and a Q plus a fused K/V projection for
  cross-attention (the official ``in_proj_weight`` rows, split); initialised as the official
  fused (3 qkv_dim, d) matrix (Xavier uniform), every other linear Xavier uniform, embeddings
  N(0, d^-1/2), all with the **SuperTransformer's** shapes, so a standalone SubTransformer starts
  as the slices of a fresh SuperTransformer would (HAT trains its searched SubTransformers from
  scratch inside the SuperTransformer: ``configs/*/subtransformer/common.yml``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.base import AttentionMask, KVCache
from ..attention.dense import sdpa
from ..attention.sinusoid import sinusoid_table
from ..config import ConfigError, ModelConfig
from ..recipes import (
    HAT_IWSLT_DECODING,
    HAT_WMT_DECODING,
    TrainRecipe,
    register_model_decoding,
    register_recipe,
)
from ..registry import register_family, register_model
from .base import IGNORE_INDEX, EffiModel, ModelOutput
from .hat_space import (  # the space lives in its own file; re-exported here
    IWSLT_SPACE,
    LATENCY_SPACES,
    MULTI30K_SPACE,
    RELEASED_WMT14_ENDE,
    SPACES,
    TINY_SPACE,
    WMT_SPACE,
    DesignSpace,
    SubTransformer,
    get_space,
    latency_space,
    sample_generator,
)
from .seq2seq import SourceChecks, label_smoothed_nll, shift_right

__all__ = [
    "DesignSpace",
    "HATConfig",
    "HATDecodingState",
    "HATEncoderOutput",
    "HAT_RECIPE",
    "IWSLT_SPACE",
    "LATENCY_SPACES",
    "MULTI30K_SPACE",
    "RELEASED_WMT14_ENDE",
    "SPACES",
    "SlicedLinear",
    "SubTransformer",
    "SubTransformerView",
    "SuperTransformer",
    "TINY_SPACE",
    "WMT_SPACE",
    "export_subtransformer",
    "get_space",
    "latency_space",
    "sample_generator",
]


# ------------------------------------------------------------------------------------------------
# Sliced modules
# ------------------------------------------------------------------------------------------------


class SlicedLinear(nn.Linear):
    """``nn.Linear(in_features, out_features)`` whose forward uses the front slice
    ``W[:out, :in]`` and ``bias[:out]``: ``in`` is the input's last dimension, ``out`` an
    argument (default: all). ``init_shape``: the (out, in) of the SuperTransformer layer this
    one is a slice of (the Xavier bound is computed from it)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        init_shape: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.init_shape = init_shape or (out_features, in_features)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if not hasattr(self, "init_shape"):  # nn.Linear.__init__ calls this first
            return
        fan_out, fan_in = self.init_shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, out: int | None = None) -> Tensor:  # type: ignore[override]
        """x: (..., in) with ``in <= in_features`` -> (..., out)."""
        d = x.shape[-1]
        out = self.out_features if out is None else out
        if d > self.in_features or out > self.out_features:
            raise ValueError(
                f"a slice ({out}, {d}) does not fit this layer ({self.out_features}, "
                f"{self.in_features})"
            )
        bias = None if self.bias is None else self.bias[:out]
        return F.linear(x, self.weight[:out, :d], bias)


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """LayerNorm over x's width d with ``weight[:d]`` and ``bias[:d]``."""
    d = x.shape[-1]
    return F.layer_norm(x, (d,), norm.weight[:d], norm.bias[:d], norm.eps)


def _heads(t: Tensor, n_heads: int) -> Tensor:
    b, n, w = t.shape
    return t.view(b, n, n_heads, w // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def _merge(o: Tensor) -> Tensor:
    b, h, n, dh = o.shape
    return o.transpose(1, 2).reshape(b, n, h * dh)  # (B, T, H*Dh)


class SuperSelfAttention(nn.Module):
    """Self-attention at a sampled width: a fused Q/K/V projection (3 qkv_dim, d) sliced only in
    its input columns, ``heads`` heads of ``qkv_dim / heads``, the output projection
    (d, qkv_dim) sliced in its rows."""

    def __init__(self, dim: int, qkv_dim: int, *, dropout: float, init_dim: int) -> None:
        super().__init__()
        self.qkv_dim, self.dropout = qkv_dim, dropout
        self.qkv = SlicedLinear(dim, 3 * qkv_dim, init_shape=(3 * qkv_dim, init_dim))
        self.out = SlicedLinear(qkv_dim, dim, init_shape=(init_dim, qkv_dim))

    def forward(
        self, x: Tensor, heads: int, mask: AttentionMask, cache: KVCache | None = None
    ) -> tuple[Tensor, KVCache | None]:
        """x: (R, T, d) -> ((R, T, d), the extended cache when one is given)."""
        q, k, v = self.qkv(x).split(self.qkv_dim, dim=-1)  # (R, T, qkv) each
        q, k, v = _heads(q, heads), _heads(k, heads), _heads(v, heads)  # (R, H, T, Dh)
        if cache is not None:
            cache = cache.extend(k, v)
            k, v = cache.k, cache.v  # (R, H, Tpast + T, Dh)
        p = self.dropout if self.training else 0.0
        o = sdpa(q, k, v, mask, p)  # (R, H, T, Dh); scale 1/sqrt(qkv/heads)
        return self.out(_merge(o), x.shape[-1]), cache


class SuperCrossAttention(nn.Module):
    """Encoder-decoder attention at sampled widths: Q (qkv_dim, d_dec) and fused K/V
    (2 qkv_dim, d_enc) sliced in their input columns, output (d_dec, qkv_dim) in its rows.
    Decoder rows ``R = B * G`` (beams) are folded into the query axis, as
    :class:`~effiformer.attention.cross.CrossAttention` does, so the memory is kept once per
    sentence."""

    def __init__(
        self, dim: int, memory_dim: int, qkv_dim: int, *, dropout: float, init_dims: tuple[int, int]
    ) -> None:
        super().__init__()
        self.qkv_dim, self.dropout = qkv_dim, dropout
        init_dim, init_memory = init_dims
        self.q = SlicedLinear(dim, qkv_dim, init_shape=(3 * qkv_dim, init_dim))
        self.kv = SlicedLinear(memory_dim, 2 * qkv_dim, init_shape=(3 * qkv_dim, init_memory))
        self.out = SlicedLinear(qkv_dim, dim, init_shape=(init_dim, qkv_dim))

    def project_memory(self, memory: Tensor, heads: int) -> KVCache:
        """(B, m S, d_enc) concatenated encoder outputs -> keys and values (B, H, m S, Dh)."""
        k, v = self.kv(memory).split(self.qkv_dim, dim=-1)
        return KVCache(_heads(k, heads), _heads(v, heads))

    def forward(self, x: Tensor, memory: KVCache, key_padding: Tensor | None) -> Tensor:
        """x: (R, Tq, d_dec), memory: (B, H, mS, Dh), key_padding (B, mS) -> (R, Tq, d_dec)."""
        b, h, _, dh = memory.k.shape
        r, tq = x.shape[0], x.shape[1]
        if r % b:
            raise ValueError(f"{r} decoder rows for {b} source sentences: not a whole number each")
        g = r // b
        q = _heads(self.q(x), h)  # (R, H, Tq, Dh)
        q = q.view(b, g, h, tq, dh).transpose(1, 2).reshape(b, h, g * tq, dh)  # (B, H, G*Tq, Dh)
        p = self.dropout if self.training else 0.0
        o = sdpa(q, memory.k, memory.v, AttentionMask(key_padding=key_padding), p)
        o = o.view(b, h, g, tq, dh).permute(0, 2, 3, 1, 4).reshape(r, tq, h * dh)  # (R, Tq, qkv)
        return self.out(o, x.shape[-1])


class SuperEncoderLayer(nn.Module):
    """Post-LN encoder layer: LN(x + drop(attn x)); LN(x + drop(fc2(drop_a(relu(fc1 x)))))."""

    def __init__(
        self, dim: int, ffn_dim: int, qkv_dim: int, *, attn_dropout: float, init: tuple[int, int]
    ):
        super().__init__()
        init_dim, init_ffn = init
        self.attn = SuperSelfAttention(dim, qkv_dim, dropout=attn_dropout, init_dim=init_dim)
        self.norm1 = nn.LayerNorm(dim)
        self.fc1 = SlicedLinear(dim, ffn_dim, init_shape=(init_ffn, init_dim))
        self.fc2 = SlicedLinear(ffn_dim, dim, init_shape=(init_dim, init_ffn))
        self.norm2 = nn.LayerNorm(dim)

    def forward(
        self, x: Tensor, *, ffn: int, heads: int, mask: AttentionMask, p: float, p_act: float
    ) -> Tensor:
        """x: (B, S, d) -> (B, S, d); ``p`` / ``p_act``: the rescaled dropouts."""
        a, _ = self.attn(x, heads, mask)
        x = _layer_norm(self.norm1, x + F.dropout(a, p, self.training))
        h = F.dropout(F.relu(self.fc1(x, ffn)), p_act, self.training)
        h = self.fc2(h, x.shape[-1])
        return _layer_norm(self.norm2, x + F.dropout(h, p, self.training))


@dataclass(frozen=True)
class HATDecoderLayerState:
    """One decoder layer's decoding state: its self-attention cache (R, H, T, Dh) and its
    projected encoder memory (B, H, m S, Dh) with the tiled padding mask (B, m S) or None."""

    self_attn: KVCache
    cross: KVCache
    cross_mask: Tensor | None


class SuperDecoderLayer(nn.Module):
    """Post-LN decoder layer: causal self-attention, encoder-decoder attention over the
    concatenated outputs of the last ``attend`` encoder layers, FFN."""

    def __init__(
        self,
        dim: int,
        memory_dim: int,
        ffn_dim: int,
        qkv_dim: int,
        *,
        attn_dropout: float,
        init: tuple[int, int, int],
    ):
        super().__init__()
        init_dim, init_memory, init_ffn = init
        self.attn = SuperSelfAttention(dim, qkv_dim, dropout=attn_dropout, init_dim=init_dim)
        self.norm1 = nn.LayerNorm(dim)
        self.cross = SuperCrossAttention(
            dim, memory_dim, qkv_dim, dropout=attn_dropout, init_dims=(init_dim, init_memory)
        )
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = SlicedLinear(dim, ffn_dim, init_shape=(init_ffn, init_dim))
        self.fc2 = SlicedLinear(ffn_dim, dim, init_shape=(init_dim, init_ffn))
        self.norm3 = nn.LayerNorm(dim)

    def forward(
        self,
        x: Tensor,
        *,
        ffn: int,
        heads: int,
        memory: KVCache,
        memory_mask: Tensor | None,
        cache: KVCache | None,
        p: float,
        p_act: float,
    ) -> tuple[Tensor, KVCache | None]:
        """x: (R, T, d) -> ((R, T, d), the extended self-attention cache or None)."""
        a, cache = self.attn(x, heads, AttentionMask(causal=True), cache)
        x = _layer_norm(self.norm1, x + F.dropout(a, p, self.training))
        c = self.cross(x, memory, memory_mask)
        x = _layer_norm(self.norm2, x + F.dropout(c, p, self.training))
        h = F.dropout(F.relu(self.fc1(x, ffn)), p_act, self.training)
        h = self.fc2(h, x.shape[-1])
        return _layer_norm(self.norm3, x + F.dropout(h, p, self.training)), cache


# ------------------------------------------------------------------------------------------------
# The config and the model
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HATConfig(ModelConfig):
    """A SuperTransformer (``sub=None``) or a standalone SubTransformer (``sub=``).

    ``space``: its :class:`DesignSpace` (a name of :data:`SPACES`, the space itself or its dict);
    the SuperTransformer has the largest of every choice. ``sub``: build a standalone model of
    exactly this architecture instead (its own widths and depths; dropout rescaling, the
    sinusoid table and the initialisation still refer to ``space``'s SuperTransformer, as when
    HAT trains a SubTransformer from scratch). ``dropout`` (0.3, the WMT recipe), ``attn_dropout``
    (0.1), ``activation_dropout``: at the SuperTransformer's width (rescaled per sample);
    ``label_smoothing``; ``share_embeddings``: one table for source and target tokens (fairseq
    ``--share-all-embeddings``); ``tie_output``: the output projection is the target embedding;
    ``pad_id`` / ``bos_id`` / ``eos_id``: the tokenizer's specials (as ``seq2seq``).

    ``dim``, ``n_heads``, ``head_dim``, ``n_layers`` and ``ffn_dim`` are derived from the built
    architecture (the larger embedding width, the most heads, ``qkv_dim / n_heads``, the encoder
    depth, the widest FFN) and recomputed whatever is given; ``causal`` is True (the decoder),
    ``mem_len`` 0 and ``attention`` None (HAT's attention is its own dense, sliced one).
    """

    family = "hat"

    space: DesignSpace | str = "wmt"
    sub: SubTransformer | None = None
    vocab_size: int = 32768
    seq_len: int = 256
    dropout: float = 0.3
    attn_dropout: float = 0.1
    activation_dropout: float = 0.0
    label_smoothing: float = 0.1
    share_embeddings: bool = True
    tie_output: bool = True
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "space", get_space(self.space))
        if self.sub is not None and not isinstance(self.sub, SubTransformer):
            if not isinstance(self.sub, Mapping):
                raise ConfigError(
                    f"sub must be a SubTransformer or its dict, got {type(self.sub).__name__}"
                )
            object.__setattr__(self, "sub", SubTransformer.from_dict(self.sub))
        if self.sub is not None:
            object.__setattr__(self, "sub", self.sub.trimmed())
            self._check_fits(self.sub)
        if self.attention is not None:
            raise ConfigError("attention must be None for hat (it has its own sliced attention)")
        if not self.causal or self.mem_len != 0:
            raise ConfigError("causal must stay True and mem_len 0 for hat")
        arch = self.arch
        heads = max((*arch.encoder_heads, *arch.decoder_heads, *arch.cross_heads))
        object.__setattr__(self, "dim", max(arch.encoder_dim, arch.decoder_dim))
        object.__setattr__(self, "n_heads", heads)
        object.__setattr__(self, "head_dim", self.space.qkv_dim // heads)
        object.__setattr__(self, "n_layers", arch.encoder_layers)
        object.__setattr__(self, "ffn_dim", max((*arch.encoder_ffn, *arch.decoder_ffn)))
        super().__post_init__()
        for name in ("activation_dropout", "label_smoothing"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {v}")
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
        for side in ("encoder", "decoder"):
            if getattr(self.space, f"max_{side}_dim") % 2:
                raise ConfigError(f"sinusoidal positions need an even {side} width")

    def _check_fits(self, sub: SubTransformer) -> None:
        s = self.space
        for h in (*sub.encoder_heads, *sub.decoder_heads, *sub.cross_heads):
            if s.qkv_dim % h:
                raise ConfigError(f"sub: {h} heads do not divide qkv_dim={s.qkv_dim}")
        if sub.encoder_dim > s.max_encoder_dim or sub.decoder_dim > s.max_decoder_dim:
            raise ConfigError(
                f"sub: widths {sub.encoder_dim}/{sub.decoder_dim} exceed the space's "
                f"{s.max_encoder_dim}/{s.max_decoder_dim}"
            )

    @property
    def arch(self) -> SubTransformer:
        """The architecture the modules are built at: ``sub``, or the space's largest."""
        return self.sub if self.sub is not None else self.space.largest()

    @property
    def decoder_layers(self) -> int:
        return self.arch.decoder_layers


@dataclass(frozen=True)
class HATEncoderOutput:
    """What :meth:`SuperTransformer.encode` returns. ``states``: the outputs of the active
    encoder layers, (B, S, d_enc) each, in order (the last is the encoder output);
    ``mask``: (B, S) bool, True on real tokens (None: no padding); ``sample``: the
    SubTransformer that encoded (the decoder runs the same one)."""

    states: tuple[Tensor, ...]
    mask: Tensor | None
    sample: SubTransformer

    @property
    def hidden(self) -> Tensor:
        return self.states[-1]

    def memory(self, m: int) -> tuple[Tensor, Tensor | None]:
        """The last ``m`` encoder outputs concatenated along time, last first
        (B, m S, d_enc), and the padding mask tiled to match (B, m S)."""
        if not 1 <= m <= len(self.states):
            raise ValueError(f"cannot attend to {m} of {len(self.states)} encoder layers")
        mem = torch.cat([self.states[-1 - i] for i in range(m)], dim=1)  # (B, m*S, d)
        mask = None if self.mask is None else self.mask.repeat(1, m)  # (B, m*S)
        return mem, mask


@dataclass(frozen=True)
class HATDecodingState:
    """Incremental decoding state: per active decoder layer a :class:`HATDecoderLayerState`;
    ``length``: target positions fed so far; ``rows``: decoder rows R (sentence-major);
    ``sample``: the SubTransformer being decoded."""

    layers: tuple[HATDecoderLayerState, ...]
    length: int
    rows: int
    sample: SubTransformer


class SuperTransformer(SourceChecks, EffiModel):
    """HAT's SuperTransformer (or a standalone SubTransformer); see the module docstring."""

    def __init__(self, config: HATConfig) -> None:
        super().__init__()
        self.config = config
        c, s, a = config, config.space, config.arch
        self.arch = a
        q = s.qkv_dim
        self._super_dims = (s.max_encoder_dim, s.max_decoder_dim)
        width = max(a.encoder_dim, a.decoder_dim) if c.share_embeddings else a.decoder_dim
        self.embed = nn.Embedding(c.vocab_size, width, padding_idx=c.pad_id)
        self.src_embed = (
            self.embed
            if c.share_embeddings
            else nn.Embedding(c.vocab_size, a.encoder_dim, padding_idx=c.pad_id)
        )
        ffn_e, ffn_d = max(s.encoder_ffn), max(s.decoder_ffn)
        de, dd = s.max_encoder_dim, s.max_decoder_dim
        self.encoder = nn.ModuleList(
            SuperEncoderLayer(
                a.encoder_dim, a.encoder_ffn[i], q, attn_dropout=c.attn_dropout, init=(de, ffn_e)
            )
            for i in range(a.encoder_layers)
        )
        self.decoder = nn.ModuleList(
            SuperDecoderLayer(
                a.decoder_dim,
                a.encoder_dim,
                a.decoder_ffn[i],
                q,
                attn_dropout=c.attn_dropout,
                init=(dd, de, ffn_d),
            )
            for i in range(a.decoder_layers)
        )
        self.head = None
        if not c.tie_output:
            self.head = SlicedLinear(a.decoder_dim, c.vocab_size, bias=False)
            nn.init.normal_(self.head.weight, std=dd**-0.5)  # fairseq's embed_out
        with torch.no_grad():  # N(0, d^-1/2) at the SuperTransformer's width, zero padding row
            tables = [(self.embed, max(de, dd) if c.share_embeddings else dd)]
            if not c.share_embeddings:
                tables.append((self.src_embed, de))
            for emb, d in tables:
                nn.init.normal_(emb.weight, std=d**-0.5)
                emb.weight[c.pad_id].zero_()

    # ---- samples ---------------------------------------------------------------------------

    def resolve(self, sample: SubTransformer | None) -> SubTransformer:
        """``sample`` checked against the built modules (None: the built architecture)."""
        if sample is None:
            return self.arch
        if not isinstance(sample, SubTransformer):
            raise TypeError(f"sample must be a SubTransformer, got {type(sample).__name__}")
        a, q = self.arch, self.config.space.qkv_dim
        problems = []
        if sample.encoder_dim > a.encoder_dim or sample.decoder_dim > a.decoder_dim:
            problems.append(
                f"widths {sample.encoder_dim}/{sample.decoder_dim} > {a.encoder_dim}/{a.decoder_dim}"
            )
        if sample.encoder_layers > a.encoder_layers or sample.decoder_layers > a.decoder_layers:
            problems.append(
                f"depths {sample.encoder_layers}/{sample.decoder_layers} > "
                f"{a.encoder_layers}/{a.decoder_layers}"
            )
        else:
            for i in range(sample.encoder_layers):
                if sample.encoder_ffn[i] > a.encoder_ffn[i]:
                    problems.append(
                        f"encoder_ffn[{i}]={sample.encoder_ffn[i]} > {a.encoder_ffn[i]}"
                    )
            for i in range(sample.decoder_layers):
                if sample.decoder_ffn[i] > a.decoder_ffn[i]:
                    problems.append(
                        f"decoder_ffn[{i}]={sample.decoder_ffn[i]} > {a.decoder_ffn[i]}"
                    )
        t = sample.trimmed()
        for h in (*t.encoder_heads, *t.decoder_heads, *t.cross_heads):
            if q % h:
                problems.append(f"{h} heads do not divide qkv_dim={q}")
        if problems:
            raise ValueError(f"the SubTransformer does not fit this model: {'; '.join(problems)}")
        return sample

    def bind(self, sample: SubTransformer | None) -> SubTransformerView:
        """A model-shaped view of this model that always runs ``sample`` (for beam search,
        the translation task's loss and BLEU, decoding latency)."""
        return SubTransformerView(self, self.resolve(sample))

    def _dropouts(self, d: int, side: int) -> tuple[float, float]:
        ratio = d / self._super_dims[side]
        return self.config.dropout * ratio, self.config.activation_dropout * ratio

    def _embed(self, table: nn.Embedding, ids: Tensor, d: int, side: int, offset: int) -> Tensor:
        x = F.embedding(ids, table.weight[:, :d], table.padding_idx) * math.sqrt(d)  # (B, T, d)
        pos = torch.arange(offset, offset + ids.shape[1], device=ids.device)
        table_pe = sinusoid_table(pos, self._super_dims[side])[:, :d]  # first d of the super's
        x = x + table_pe.to(x.dtype)[None]
        return F.dropout(x, self._dropouts(d, side)[0], self.training)

    # ---- encoder and decoder ---------------------------------------------------------------

    def encode(
        self,
        src_ids: Tensor,
        *,
        src_mask: Tensor | None = None,
        sample: SubTransformer | None = None,
    ) -> HATEncoderOutput:
        """src_ids (B, S) -> :class:`HATEncoderOutput` of SubTransformer ``sample``."""
        sub = self.resolve(sample)
        self._check_ids(src_ids, "src_ids")
        mask = self._source_mask(src_ids, src_mask)
        d = sub.encoder_dim
        x = self._embed(self.src_embed, src_ids, d, 0, 0)  # (B, S, d)
        p, p_act = self._dropouts(d, 0)
        amask = AttentionMask(key_padding=mask)
        states = []
        for i in range(sub.encoder_layers):  # layers past the sampled depth: identity
            x = self.encoder[i](
                x, ffn=sub.encoder_ffn[i], heads=sub.encoder_heads[i], mask=amask, p=p, p_act=p_act
            )
            states.append(x)
        return HATEncoderOutput(states=tuple(states), mask=mask, sample=sub)

    def _project_memories(self, enc: HATEncoderOutput) -> list[tuple[KVCache, Tensor | None]]:
        sub = enc.sample
        out = []
        for j in range(sub.decoder_layers):
            mem, mask = enc.memory(sub.attend[j])  # (B, m*S, d_enc), (B, m*S)
            out.append((self.decoder[j].cross.project_memory(mem, sub.cross_heads[j]), mask))
        return out

    def _decode(
        self,
        tgt_in: Tensor,
        sub: SubTransformer,
        memories: Sequence[tuple[KVCache, Tensor | None]],
        caches: Sequence[KVCache] | None,
        offset: int,
    ) -> tuple[Tensor, list[KVCache] | None]:
        limit = self.config.seq_len
        if offset + tgt_in.shape[1] > limit:
            raise ValueError(
                f"decoder positions up to {offset + tgt_in.shape[1]} exceed the model's limit "
                f"seq_len={limit}"
            )
        self._check_ids(tgt_in, "tgt_in")
        d = sub.decoder_dim
        x = self._embed(self.embed, tgt_in, d, 1, offset)  # (R, T, d)
        p, p_act = self._dropouts(d, 1)
        new_caches = None if caches is None else []
        for j in range(sub.decoder_layers):
            mem, mask = memories[j]
            x, cache = self.decoder[j](
                x,
                ffn=sub.decoder_ffn[j],
                heads=sub.decoder_heads[j],
                memory=mem,
                memory_mask=mask,
                cache=None if caches is None else caches[j],
                p=p,
                p_act=p_act,
            )
            if new_caches is not None:
                new_caches.append(cache)
        return x, new_caches

    def _logits(self, h: Tensor) -> Tensor:
        d = h.shape[-1]
        w = self.embed.weight if self.head is None else self.head.weight
        return F.linear(h, w[:, :d])  # (R, T, V)

    def decode(self, tgt_in: Tensor, enc: HATEncoderOutput) -> ModelOutput:
        """Teacher-forced decoder over ``tgt_in`` (B, T) -> logits (B, T, V)."""
        h, _ = self._decode(tgt_in, enc.sample, self._project_memories(enc), None, 0)
        return ModelOutput(logits=self._logits(h), hidden=h)

    def forward(
        self,
        src_ids: Tensor,
        tgt_in: Tensor | None = None,
        *,
        targets: Tensor | None = None,
        src_mask: Tensor | None = None,
        sample: SubTransformer | None = None,
        state: None = None,
    ) -> ModelOutput:
        """Teacher forcing of SubTransformer ``sample`` (None: the built architecture); see the
        module docstring. ``loss``: label-smoothed cross-entropy, mean nats per target."""
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
        enc = self.encode(src_ids, src_mask=src_mask, sample=sample)
        out = self.decode(tgt_in, enc)
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
        self, enc: HATEncoderOutput, *, rows_per_sentence: int = 1
    ) -> HATDecodingState:
        """Before the first decoder token: every active decoder layer's encoder memory (its last
        ``attend`` encoder outputs, projected once per sentence) and an empty self-attention
        cache for ``B * rows_per_sentence`` rows."""
        if not isinstance(enc, HATEncoderOutput):
            raise TypeError(f"enc must be a HATEncoderOutput, got {type(enc).__name__}")
        if isinstance(rows_per_sentence, bool) or rows_per_sentence < 1:
            raise ValueError(f"rows_per_sentence must be >= 1, got {rows_per_sentence!r}")
        sub = enc.sample
        ref = enc.hidden
        rows = ref.shape[0] * rows_per_sentence
        q = self.config.space.qkv_dim
        layers = []
        for j, (mem, mask) in enumerate(self._project_memories(enc)):
            h = sub.decoder_heads[j]
            empty = KVCache.empty(rows, h, q // h, device=ref.device, dtype=ref.dtype)
            layers.append(HATDecoderLayerState(empty, mem, mask))
        return HATDecodingState(tuple(layers), 0, rows, sub)

    def decode_step(self, tokens: Tensor, state: HATDecodingState) -> ModelOutput:
        """``tokens`` (R, t) after everything ``state`` has seen -> ModelOutput(logits (R, t, V),
        state: the next :class:`HATDecodingState`)."""
        if not isinstance(state, HATDecodingState):
            raise TypeError(f"state must be a HATDecodingState, got {type(state).__name__}")
        if tokens.shape[0] != state.rows:
            raise ValueError(f"tokens have {tokens.shape[0]} rows but the state has {state.rows}")
        memories = [(s.cross, s.cross_mask) for s in state.layers]
        caches = [s.self_attn for s in state.layers]
        h, new = self._decode(tokens, state.sample, memories, caches, state.length)
        layers = tuple(
            HATDecoderLayerState(c, s.cross, s.cross_mask) for c, s in zip(new, state.layers)
        )
        nxt = HATDecodingState(layers, state.length + tokens.shape[1], state.rows, state.sample)
        return ModelOutput(logits=self._logits(h), hidden=h, state=nxt)

    def reorder_decoding_state(self, state: HATDecodingState, index: Tensor) -> HATDecodingState:
        """Rows ``index`` (R,) of the self-attention caches, each from a row of the same sentence
        (the encoder memories are per sentence and stay)."""
        if index.dim() != 1 or index.shape[0] != state.rows:
            raise ValueError(f"index must be ({state.rows},), got {tuple(index.shape)}")
        b = state.layers[0].cross.k.shape[0] if state.layers else 1
        g = state.rows // b
        home = torch.arange(state.rows, device=index.device) // g
        if not torch.equal(index // g, home):
            raise ValueError("reorder index moves rows across sentences")
        layers = tuple(
            HATDecoderLayerState(
                KVCache(s.self_attn.k.index_select(0, index), s.self_attn.v.index_select(0, index)),
                s.cross,
                s.cross_mask,
            )
            for s in state.layers
        )
        return HATDecodingState(layers, state.length, state.rows, state.sample)

    def translate(self, sources: Any, **kwargs: Any) -> Any:
        """:func:`effiformer.generation.translate` with this model's built architecture."""
        from ..generation import translate

        return translate(self, sources, **kwargs)


class SubTransformerView(nn.Module):
    """A :class:`SuperTransformer` that always runs one SubTransformer: the seq2seq interface
    (``forward``, ``encode``, ``init_decoding_state``, ``decode_step``,
    ``reorder_decoding_state``, ``config``) with ``sample`` passed on explicitly. It shares the
    SuperTransformer's parameters (nothing is copied; :func:`export_subtransformer` makes a
    standalone copy)."""

    def __init__(self, supernet: SuperTransformer, sample: SubTransformer) -> None:
        super().__init__()
        self.supernet = supernet
        self.sample = sample

    @property
    def config(self) -> HATConfig:
        return self.supernet.config

    def forward(self, src_ids: Tensor, tgt_in: Tensor | None = None, **kwargs: Any) -> ModelOutput:
        if "sample" in kwargs:
            raise ValueError("a SubTransformerView runs its own sample; call the SuperTransformer")
        return self.supernet(src_ids, tgt_in, sample=self.sample, **kwargs)

    def encode(self, src_ids: Tensor, *, src_mask: Tensor | None = None) -> HATEncoderOutput:
        return self.supernet.encode(src_ids, src_mask=src_mask, sample=self.sample)

    def init_decoding_state(self, enc: HATEncoderOutput, *, rows_per_sentence: int = 1):
        return self.supernet.init_decoding_state(enc, rows_per_sentence=rows_per_sentence)

    def decode_step(self, tokens: Tensor, state: HATDecodingState) -> ModelOutput:
        return self.supernet.decode_step(tokens, state)

    def reorder_decoding_state(self, state: HATDecodingState, index: Tensor) -> HATDecodingState:
        return self.supernet.reorder_decoding_state(state, index)

    def translate(self, sources: Any, **kwargs: Any) -> Any:
        from ..generation import translate

        return translate(self, sources, **kwargs)

    def num_params(self) -> int:
        return self.supernet.num_params()


@torch.no_grad()
def export_subtransformer(model: SuperTransformer, sample: SubTransformer) -> SuperTransformer:
    """A standalone model of ``sample``'s own size holding copies of its slices of ``model``'s
    weights (every parameter ``p`` of the standalone model is ``model``'s
    ``P[:p.shape[0], :p.shape[1], ...]``); it computes what ``model`` computes with
    ``sample=sample``, in training mode too (same dropout rescaling). Save it with
    :func:`effiformer.save_model`."""
    if not isinstance(model, SuperTransformer):
        raise TypeError(f"model must be a SuperTransformer, got {type(model).__name__}")
    sub = model.resolve(sample).trimmed()
    config = dataclasses.replace(model.config, sub=sub)
    out = SuperTransformer(config).to(next(model.parameters()).device)
    source = dict(model.named_parameters(remove_duplicate=False))
    for name, p in out.named_parameters(remove_duplicate=False):
        big = source[name]
        p.copy_(big[tuple(slice(0, n) for n in p.shape)])
    return out.train(model.training)


# ------------------------------------------------------------------------------------------------
# Registration
# ------------------------------------------------------------------------------------------------


def build_hat(config: HATConfig) -> SuperTransformer:
    return SuperTransformer(config)


#: HAT's SuperTransformer recipe (``configs/wmt14.en-de/supertransformer/space0.yml``): Adam
#: (0.9, 0.98), no weight decay, no clipping, linear warmup over 10,000 updates to 1e-3, then
#: cosine to 1e-7 (``min_lr_ratio`` 1e-4) at 40,000 updates; label smoothing 0.1 and dropout 0.3
#: (attention 0.1) are model fields. The searched SubTransformers train the same way with a
#: 4,000-update warmup (``subtransformer/common.yml``). IWSLT uses inverse-sqrt at 5e-4.
HAT_RECIPE = TrainRecipe(
    name="hat",
    source="Wang et al. 2020, configs/wmt14.en-de/supertransformer/space0.yml",
    optimizer="adam",
    lr=1e-3,
    betas=(0.9, 0.98),
    eps=1e-8,
    weight_decay=0.0,
    warmup=10_000,
    schedule="cosine",
    min_lr_ratio=1e-4,
    clip=None,
    steps=40_000,
    notes="update-freq 16 on 8 GPUs (128 x 4096 tokens per update) in the paper",
)

register_family(HATConfig, build_hat)
register_recipe("hat", HAT_RECIPE)
register_model_decoding("hat-wmt-*", HAT_WMT_DECODING)
register_model_decoding("hat-iwslt-*", HAT_IWSLT_DECODING)
register_model(
    "hat-tiny",
    HATConfig(space="tiny", vocab_size=256, seq_len=64, dropout=0.0, attn_dropout=0.0),
    "HAT SuperTransformer over the tiny space (2 encoder, 1-2 decoder layers, d 32/24): tests",
)
register_model(
    "hat-wmt-super",
    HATConfig(space="wmt", vocab_size=32768, seq_len=1024),
    "HAT WMT'14 En-De SuperTransformer (space0: d 640/512, FFN 3072-1024, 8/4 heads, 6+1-6)",
)
register_model(
    "hat-iwslt-super",
    HATConfig(
        space="iwslt", vocab_size=10000, seq_len=1024, dropout=0.375, attn_dropout=0.0,
        share_embeddings=False, tie_output=False,
    ),
    "HAT IWSLT'14 De-En SuperTransformer (space1: d 640/512, FFN 2048-512, 4/2 heads)",
)  # fmt: skip
register_model(
    "hat-multi30k-super",
    HATConfig(space="multi30k", vocab_size=8000, seq_len=128, dropout=0.1, attn_dropout=0.1),
    "HAT SuperTransformer for Multi30k on a CPU (d 320/256, qkv 256, FFN 1024-512, 4+1-4)",
)
