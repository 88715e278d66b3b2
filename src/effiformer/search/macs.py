"""Analytic parameter counts and Mult-Adds of HAT SubTransformers (no model is built).

Conventions of the HAT README ("#Params and FLOPs do not count in the embedding lookup table and
the last output layers"), reproduced to the README's two decimals for every released WMT'14
En-De and IWSLT'14 De-En SubTransformer (``tests/search/test_macs.py``):

- **parameters** (:func:`subtransformer_params`, the official ``get_sampled_params_numel``):
  every active layer's sliced weights and biases; the Q/K/V projections count ``d x qkv_dim``
  weights each and their full ``3 qkv_dim`` bias (it is never sliced); LayerNorms count ``2 d``;
  embeddings and the output projection are left out.
- **FLOPs** (:func:`subtransformer_macs`, the official ``--profile-flops``: ``torchprofile``'s
  Mult-Adds of one teacher-forced forward of a dummy pair of ``n`` source and ``n`` target tokens,
  times 2, minus the output layer): the linear layers (Q/K/V, output, FFN), the two attention
  matrix products per attention (``Q K^T`` and ``A V``: ``2 n_q n_k qkv_dim``, whatever the
  head count), and what ``torchprofile`` counts as one Mult-Add per output element: the query
  scaling, each LayerNorm and the embedding scaling (``elementwise``; without them the
  3.5 s Raspberry Pi model's 1.5255 GFLOPs would round to 1.52, not the README's 1.53).
  ``n`` is 30 for WMT and 23 for IWSLT (the average sentence lengths HAT uses).
- **decoding Mult-Adds** (:func:`decoding_macs`): the workload HAT's latency is measured on
  (:func:`effiformer.bench.decoding.decoding_latency`): the encoder once over ``n`` tokens, then
  ``steps`` incremental decoder steps of ``beam`` rows, each attending to the ``t`` keys so far
  and to the ``m n`` keys of its encoder memory, whose keys and values are projected once per
  sentence. Matrix products only; the output layer only if ``vocab`` is given. This is the
  Mult-Adds feature of the latency predictor's linear baseline.

All of them are linear in the per-layer widths and in the number of attended encoder layers, so
they follow exactly from HAT's ten averaged features alone (:func:`features_macs`,
:func:`features_decoding_macs`), which is what HAT's released latency files hold. The
Mult-Adds baseline of the latency predictor (:func:`~effiformer.search.predictor.
compare_predictors`) is :func:`features_macs`: the count HAT's README reports (and its paper
plots against latency); :func:`features_decoding_macs`, which counts the measured workload itself,
is reported beside it as the stronger proxy.

The per-layer counts are :mod:`effiformer.flops`'s (the projections, scores, FFNs every
translation model's count is made of: :func:`~effiformer.flops.projection_mult_adds`,
:func:`~effiformer.flops.score_mult_adds`, :func:`~effiformer.flops.ffn_mult_adds`), taken per
layer with HAT's widths; this module adds HAT's conventions (the elementwise terms, the
decoding workload, the closed forms over the averaged features).

Dense models: a post-LN ``seq2seq`` config with dense attention is the SubTransformer with one
width, ``qkv_dim = n_heads * head_dim``, one FFN width and ``attend = 1``
(:func:`dense_as_subtransformer`), so the same counts apply to the dense baselines HAT is compared
with (Q/K/V biases and all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..flops import ffn_mult_adds, linear_mult_adds, projection_mult_adds, score_mult_adds
from ..models.hat import SubTransformer

__all__ = [
    "MacsBreakdown",
    "dense_as_subtransformer",
    "decoding_macs",
    "features_decoding_macs",
    "features_macs",
    "subtransformer_macs",
    "subtransformer_params",
]


@dataclass(frozen=True)
class MacsBreakdown:
    """Mult-Adds by kind: ``linear`` (projections and FFNs), ``attention`` (``Q K^T`` and
    ``A V``), ``elementwise`` (query scaling, LayerNorms, embedding scaling, as torchprofile
    counts them), ``output`` (the vocabulary projection; 0 when not counted)."""

    linear: int
    attention: int
    elementwise: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.linear + self.attention + self.elementwise + self.output

    @property
    def flops(self) -> int:
        """2 x Mult-Adds."""
        return 2 * self.total


def subtransformer_params(sub: SubTransformer, qkv_dim: int) -> int:
    """Parameters of ``sub``'s active layers, embeddings and output layer excluded (HAT's
    ``get_sampled_params_numel``)."""
    t, q = sub.trimmed(), qkv_dim
    de, dd = t.encoder_dim, t.decoder_dim
    total = 0
    for f in t.encoder_ffn:
        attn = 3 * q * de + 3 * q + q * de + de  # Q/K/V (bias never sliced) + output
        total += attn + 2 * 2 * de + de * f + f + f * de + de  # 2 LayerNorms, FFN
    for f in t.decoder_ffn:
        self_attn = 3 * q * dd + 3 * q + q * dd + dd
        cross = q * dd + 2 * q * de + 3 * q + q * dd + dd  # Q from d_dec, K/V from d_enc
        total += self_attn + cross + 3 * 2 * dd + dd * f + f + f * dd + dd
    return total


def subtransformer_macs(
    sub: SubTransformer,
    qkv_dim: int,
    *,
    src_len: int = 30,
    tgt_len: int | None = None,
    elementwise: bool = True,
    vocab: int | None = None,
) -> MacsBreakdown:
    """Mult-Adds of one teacher-forced forward of ``src_len`` source and ``tgt_len`` (default
    ``src_len``) target tokens, batch 1 (HAT's ``--profile-flops``; see the module docstring).
    ``vocab``: also count the output projection."""
    t, q = sub.trimmed(), qkv_dim
    n, m_t = src_len, src_len if tgt_len is None else tgt_len
    de, dd = t.encoder_dim, t.decoder_dim
    lin = att = elem = 0
    for f in t.encoder_ffn:
        lin += projection_mult_adds(n, n, de, q) + ffn_mult_adds(n, de, f)
        att += score_mult_adds(n, n, q)
        elem += n * q + 2 * n * de  # query scaling, 2 LayerNorms
    for f, a in zip(t.decoder_ffn, t.attend):
        keys = a * n  # the attended encoder layers' states
        lin += projection_mult_adds(m_t, m_t, dd, q)  # self-attention
        lin += projection_mult_adds(m_t, keys, dd, q, kv_dim=de)  # cross: K/V of the memory
        lin += ffn_mult_adds(m_t, dd, f)
        att += score_mult_adds(m_t, m_t, q) + score_mult_adds(m_t, keys, q)
        elem += 2 * m_t * q + 3 * m_t * dd  # two query scalings, 3 LayerNorms
    elem += n * de + m_t * dd  # embedding scaling
    out = linear_mult_adds(m_t, dd, vocab) if vocab is not None else 0
    return MacsBreakdown(lin, att, elem if elementwise else 0, out)


def decoding_macs(
    sub: SubTransformer,
    qkv_dim: int,
    *,
    src_len: int = 30,
    steps: int | None = None,
    beam: int = 5,
    vocab: int | None = None,
) -> MacsBreakdown:
    """Mult-Adds of translating one ``src_len``-token sentence with ``beam`` rows for ``steps``
    (default ``src_len``) incremental decoder steps (see the module docstring); matrix products
    only, the output layer when ``vocab`` is given."""
    t, q = sub.trimmed(), qkv_dim
    n = src_len
    steps = src_len if steps is None else steps
    de, dd, k = t.encoder_dim, t.decoder_dim, beam
    lin = att = 0
    for f in t.encoder_ffn:
        lin += projection_mult_adds(n, n, de, q) + ffn_mult_adds(n, de, f)
        att += score_mult_adds(n, n, q)
    for f, a in zip(t.decoder_ffn, t.attend):
        keys = a * n
        lin += projection_mult_adds(0, keys, dd, q, kv_dim=de)  # the memory's K/V, once
        # per step and row: self-attention over one new position (its Q/K/V and O), the
        # cross-attention's Q and O, the FFN
        per_row = projection_mult_adds(1, 1, dd, q) + projection_mult_adds(1, 0, dd, q)
        lin += steps * k * (per_row + ffn_mult_adds(1, dd, f))
        # step s attends to the s keys so far and to the memory
        att += k * sum(score_mult_adds(1, s, q) + score_mult_adds(1, keys, q)
                       for s in range(1, steps + 1))  # fmt: skip
    out = steps * k * linear_mult_adds(1, dd, vocab) if vocab is not None else 0
    return MacsBreakdown(lin, att, 0, out)


def features_decoding_macs(
    features: Sequence[float],
    qkv_dim: int = 512,
    *,
    src_len: int = 30,
    steps: int | None = None,
    beam: int = 5,
) -> float:
    """:func:`decoding_macs` (total, no output layer) from HAT's ten averaged features (the
    columns of its latency files): exact, because the count is linear in every per-layer
    width and in the number of attended layers."""
    de, ne, fe, _, dd, nd, fd, _, _, m = (float(v) for v in features[:10])
    q, n = qkv_dim, src_len
    steps = src_len if steps is None else steps
    k = beam
    enc = ne * (n * de * 3 * q + n * q * de + 2 * n * n * q) + 2 * n * de * fe * ne
    sum_t = steps * (steps + 1) / 2
    per_step = dd * 3 * q + q * dd + dd * q + q * dd
    dec = nd * (steps * k * per_step + 2 * k * q * sum_t)
    dec += 2 * steps * k * dd * fd * nd  # FFN: sum of widths = layers x mean
    dec += 2 * n * de * q * m * nd + steps * k * 2 * n * q * m * nd  # memories: sum of m_j
    return enc + dec


def dense_as_subtransformer(config) -> tuple[SubTransformer, int]:
    """(the SubTransformer, qkv_dim) a dense :class:`~effiformer.models.seq2seq.Seq2SeqConfig`
    equals: one width, ``qkv_dim = n_heads * head_dim``, its FFN width in every layer, every
    decoder layer attending to the last encoder layer. Refuses other attention parts."""
    attn = getattr(config, "attention", None)
    dec_attn = getattr(config, "decoder_self_attention", attn)
    if getattr(attn, "name", None) != "dense" or getattr(dec_attn, "name", None) != "dense":
        raise ValueError("only dense seq2seq configs map onto a SubTransformer")
    ne, nd, h = config.n_layers, config.decoder_layers, config.n_heads
    sub = SubTransformer(
        encoder_dim=config.dim,
        decoder_dim=config.dim,
        encoder_layers=ne,
        decoder_layers=nd,
        encoder_ffn=(config.ffn_dim,) * ne,
        encoder_heads=(h,) * ne,
        decoder_ffn=(config.ffn_dim,) * nd,
        decoder_heads=(h,) * nd,
        cross_heads=(h,) * nd,
        attend=(1,) * nd,
    )
    return sub, config.n_heads * config.head_dim


def features_macs(
    features: Sequence[float],
    qkv_dim: int = 512,
    *,
    src_len: int = 30,
    elementwise: bool = True,
) -> float:
    """:func:`subtransformer_macs` (total, no output layer, target length = ``src_len``) from
    HAT's ten averaged features: exact (see the module docstring)."""
    de, ne, fe, _, dd, nd, fd, _, _, m = (float(v) for v in features[:10])
    q, n = qkv_dim, src_len
    enc = ne * (n * de * 3 * q + n * q * de + 2 * n * n * q) + 2 * n * de * fe * ne
    dec = nd * (n * dd * 3 * q + 3 * n * q * dd + 2 * n * n * q)  # self Q/K/V, 3 x (d, qkv)
    dec += 2 * n * dd * fd * nd + m * nd * (2 * n * de * q + 2 * n * n * q)
    elem = ne * (n * q + 2 * n * de) + nd * (2 * n * q + 3 * n * dd) + n * de + n * dd
    return enc + dec + (elem if elementwise else 0.0)
