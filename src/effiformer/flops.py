"""Analytic Mult-Adds (multiply-accumulates) of a translation model, from its config alone.

What Lite Transformer (Wu et al. 2020, arXiv 2004.11886) and HAT (Wang et al. 2020, arXiv
2005.14187) report as "Mult-Adds": the multiply-accumulates of the matmuls of one forward pass
over one sentence of a fixed length (30 tokens, source and target), teacher-forced, every query
against every key (a profiler of the decoder's matmuls counts the masked half too); the embedding
lookups and the output projection to the vocabulary are left out, and so are softmax, norms,
activations, biases and residual additions. With this rule the count reproduces the papers'
figures: Lite Transformer's WMT models (d 200 / 408 / 496) give 89.95 / 359.2 / 527.0 M (paper:
90 / 360 / 527 M) and Transformer-base 1,337.8 M (paper: "1,335 M"); see ``tests/test_flops.py``.
The depthwise taps of a convolution (``C * K`` per position) are excluded by default (they are
not matmuls; with them the WMT models count 90.7 / 360.6 / 528.7 M); ``taps=True`` adds them.

Building blocks for other counters (HAT's SubTransformers, whose layers differ in width):

- :func:`attention_mult_adds`: one self-attention layer of any registered part, through the
  part's :meth:`~effiformer.attention.base.AttentionPart.mult_adds` (``None`` when the part does
  not say);
- :func:`cross_attention_mult_adds`: dense encoder-decoder attention of ``tq`` queries over
  ``tk`` encoder states (of width ``kv_dim``, HAT's ``kdim``/``vdim``);
- :func:`ffn_mult_adds`, :func:`linear_mult_adds`.

:func:`seq2seq_mult_adds` sums them for a ``seq2seq`` config; :func:`mult_adds` is the
family-agnostic entry point (``None`` for a family it cannot count), :func:`format_mult_adds`
what ``effiformer list`` prints, :func:`count_parameters` the parameter count without
embeddings and output projection (the papers' "#Params").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .attention.base import AttentionDims
from .config import AttentionConfig, ModelConfig

__all__ = [
    "DEFAULT_SENTENCE_LEN",
    "MultAdds",
    "attention_mult_adds",
    "causal_pairs",
    "counted_flops",
    "count_parameters",
    "cross_attention_mult_adds",
    "ffn_mult_adds",
    "format_mult_adds",
    "linear_mult_adds",
    "mult_adds",
    "projection_mult_adds",
    "score_mult_adds",
    "sdpa_flop_formulas",
    "seq2seq_mult_adds",
]

#: The sentence length Lite Transformer and HAT count Mult-Adds at.
DEFAULT_SENTENCE_LEN = 30


@dataclass(frozen=True)
class MultAdds:
    """A model's Mult-Adds: ``total`` and its ``parts`` by name (``"encoder.self_attention"``,
    ``"encoder.ffn"``, ``"decoder.self_attention"``, ``"decoder.cross_attention"``,
    ``"decoder.ffn"``), for ``src_len`` source and ``tgt_len`` target tokens; ``taps``: whether
    depthwise convolution taps are counted."""

    total: int
    src_len: int
    tgt_len: int
    taps: bool = False
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def encoder(self) -> int:
        return sum(v for k, v in self.parts.items() if k.startswith("encoder."))

    @property
    def decoder(self) -> int:
        return sum(v for k, v in self.parts.items() if k.startswith("decoder."))

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "src_len": self.src_len,
            "tgt_len": self.tgt_len,
            "taps": self.taps,
            "parts": dict(self.parts),
        }


def linear_mult_adds(n: int, d_in: int, d_out: int) -> int:
    """A ``d_in -> d_out`` linear over ``n`` positions."""
    return n * d_in * d_out


def ffn_mult_adds(n: int, dim: int, ffn_dim: int) -> int:
    """The position-wise FFN, ``dim -> ffn_dim -> dim``, over ``n`` positions."""
    return 2 * n * dim * ffn_dim


def attention_mult_adds(
    config: AttentionConfig, dims: AttentionDims, tq: int, tk: int, *, taps: bool = False
) -> int | None:
    """One self-attention layer (layer ``dims.layer`` of ``dims.n_layers``) of the registered
    part ``config`` names: its :meth:`~effiformer.attention.base.AttentionPart.mult_adds`, or
    ``None`` when the part does not say."""
    from .attention.registry import get_attention

    resolved = config.for_layer(dims.layer, dims.n_layers)
    part = get_attention(resolved.name).module_cls
    return part.mult_adds(resolved, dims, tq, tk, taps=taps)


def projection_mult_adds(
    tq: int, tk: int, dim: int, inner: int, *, kv_dim: int | None = None
) -> int:
    """The four projections of a dense attention: Q and O over ``tq`` positions of width
    ``dim`` (``dim x inner`` each), K and V over ``tk`` positions of width ``kv_dim`` (default
    ``dim``)."""
    kv = dim if kv_dim is None else kv_dim
    return 2 * tq * dim * inner + 2 * tk * kv * inner


def score_mult_adds(tq: int, tk: int, inner: int) -> int:
    """``Q K^T`` and the weighted sum of V: ``tq * tk * inner`` each, every query against every
    key (a causal mask is not subtracted: the papers' count)."""
    return 2 * tq * tk * inner


def cross_attention_mult_adds(
    dim: int, n_heads: int, head_dim: int, tq: int, tk: int, *, kv_dim: int | None = None
) -> int:
    """Dense encoder-decoder attention: Q and O projections of the ``tq`` decoder positions
    (``dim x H*Dh``), K and V of the ``tk`` encoder states (``kv_dim x H*Dh``, default ``dim``),
    scores and weighted sum (``tq * tk * H*Dh`` each)."""
    inner = n_heads * head_dim
    return projection_mult_adds(tq, tk, dim, inner, kv_dim=kv_dim) + score_mult_adds(tq, tk, inner)


def seq2seq_mult_adds(
    config: ModelConfig,
    *,
    src_len: int = DEFAULT_SENTENCE_LEN,
    tgt_len: int | None = None,
    taps: bool = False,
) -> MultAdds | None:
    """Mult-Adds of a ``seq2seq`` config for one sentence (module docstring); ``tgt_len``
    defaults to ``src_len``. ``None`` when a self-attention part does not count itself."""
    if getattr(config, "family", None) != "seq2seq":
        raise ValueError(f"seq2seq_mult_adds counts seq2seq configs, got family {config.family!r}")
    for name, v in (("src_len", src_len), ("tgt_len", tgt_len)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    s = src_len
    t = src_len if tgt_len is None else tgt_len
    c = config
    parts = {
        "encoder.self_attention": 0,
        "encoder.ffn": 0,
        "decoder.self_attention": 0,
        "decoder.cross_attention": 0,
        "decoder.ffn": 0,
    }

    def dims(layer: int, n: int, causal: bool) -> AttentionDims:
        return AttentionDims(
            c.dim, c.n_heads, c.head_dim, causal=causal, layer=layer, n_layers=n, max_len=c.seq_len
        )

    for i in range(c.n_layers):
        a = attention_mult_adds(c.attention, dims(i, c.n_layers, False), s, s, taps=taps)
        if a is None:
            return None
        parts["encoder.self_attention"] += a
        parts["encoder.ffn"] += ffn_mult_adds(s, c.dim, c.ffn_dim)
    for i in range(c.decoder_layers):
        d = dims(i, c.decoder_layers, True)
        a = attention_mult_adds(c.decoder_self_attention, d, t, t, taps=taps)
        if a is None:
            return None
        parts["decoder.self_attention"] += a
        parts["decoder.cross_attention"] += cross_attention_mult_adds(
            c.dim, c.n_heads, c.head_dim, t, s
        )
        parts["decoder.ffn"] += ffn_mult_adds(t, c.dim, c.ffn_dim)
    return MultAdds(total=sum(parts.values()), src_len=s, tgt_len=t, taps=taps, parts=parts)


def mult_adds(config: ModelConfig, **kwargs: Any) -> MultAdds | None:
    """Mult-Adds of ``config`` (keyword arguments as :func:`seq2seq_mult_adds`), or ``None`` for
    a family this module does not count (so far: translation models only)."""
    if getattr(config, "family", None) == "seq2seq":
        return seq2seq_mult_adds(config, **kwargs)
    return None


def format_mult_adds(value: MultAdds | int | None) -> str:
    """``527M`` / ``1.34G`` / ``-`` (unknown)."""
    if value is None:
        return "-"
    n = value.total if isinstance(value, MultAdds) else int(value)
    if n >= 10**10:
        return f"{n / 1e9:.0f}G"
    if n >= 10**9:
        return f"{n / 1e9:.2f}G"
    if n >= 10**7:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e6:.1f}M"


def count_parameters(model: nn.Module, *, embeddings: bool = False) -> int:
    """Parameters of ``model`` (each counted once, tied ones too); without ``embeddings``, those
    of its ``nn.Embedding`` modules (token and learned position tables) and of its output
    projection (a ``head`` attribute) are left out, as the papers count "#Params"."""
    skip: set[int] = set()
    if not embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                skip.update(id(p) for p in m.parameters())
        head = getattr(model, "head", None)
        if isinstance(head, nn.Module):
            skip.update(id(p) for p in head.parameters())
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel()
    return total


# ------------------------------------------------------------------------------------------------
# Counted FLOPs: what torch's FlopCounterMode counts on a real call, with the attention kernels
# counted as they compute
# ------------------------------------------------------------------------------------------------

#: The SDPA kernels this module gives FLOP formulas (name, forward?): PyTorch has none for the
#: CPU flash kernel, and counts a causal call of the CUDA ones as if every pair were computed.
SDPA_OPS = (
    ("_scaled_dot_product_flash_attention_for_cpu", True),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", False),
    ("_scaled_dot_product_flash_attention", True),
    ("_scaled_dot_product_flash_attention_backward", False),
    ("_scaled_dot_product_efficient_attention", True),
    ("_scaled_dot_product_efficient_attention_backward", False),
    ("_scaled_dot_product_cudnn_attention", True),
    ("_scaled_dot_product_cudnn_attention_backward", False),
)


def causal_pairs(tq: int, tk: int) -> int:
    """(query, key) pairs a causal SDPA call computes: query i sees keys 0..i (top-left
    aligned, as SDPA's ``is_causal`` defines it), ``tq * tk`` when no query is cut."""
    if tq <= tk:
        return tq * (tq + 1) // 2
    return tk * (tk + 1) // 2 + (tq - tk) * tk


def _sdpa_formula(arg_names: list[str], defaults: dict[str, Any], forward: bool):
    def formula(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        bound = {**defaults, **dict(zip(arg_names, args)), **kwargs}
        b, hq, sq, dq = bound["query"]
        sk, dv = bound["key"][2], bound["value"][3]
        pairs = causal_pairs(sq, sk) if bound.get("is_causal") else sq * sk
        per_pair = (dq + dv) if forward else (3 * dq + 2 * dv)
        return 2 * b * hq * pairs * per_pair

    return formula


def sdpa_flop_formulas() -> dict[Any, Callable[..., int]]:
    """``FlopCounterMode(custom_mapping=...)`` formulas for every SDPA kernel of
    :data:`SDPA_OPS` this torch has: forward ``2·B·H·pairs·(Dq + Dv)``, backward
    ``2·B·H·pairs·(3·Dq + 2·Dv)`` (PyTorch's formulas with ``Tq·Tk`` replaced by the pairs the
    kernel computes: every pair without ``is_causal``, :func:`causal_pairs` with it). An
    explicit ``attn_mask`` is counted in full: the kernel computes every pair, then masks."""
    aten = torch.ops.aten
    extra: dict[Any, Callable[..., int]] = {}
    for name, forward in SDPA_OPS:
        if not hasattr(aten, name):
            continue
        packet = getattr(aten, name)
        schema = packet.default._schema
        names = [a.name for a in schema.arguments]
        defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        extra[packet] = _sdpa_formula(names, defaults, forward)
    return extra


def counted_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of calling ``fn()`` (a forward, or a forward and its ``backward()``), as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them (matmuls, convolutions, attention
    kernels; elementwise work is free) with :func:`sdpa_flop_formulas` for the attention
    kernels. One FLOP counted per multiply and per add: twice the Mult-Adds of a matmul."""
    with FlopCounterMode(display=False, custom_mapping=sdpa_flop_formulas()) as fc:
        fn()
    return int(fc.get_total_flops())
