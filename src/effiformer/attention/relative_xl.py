"""Transformer-XL relative multi-head attention with the relative-shift trick.

Dai, Yang, Yang, Carbonell, Le, Salakhutdinov 2019, "Transformer-XL: Attentive Language Models
Beyond a Fixed-Length Context", arXiv 1901.02860, section 3.3, eq. (after "we propose"):

    A_{i,j} = q_i^T k_j  +  q_i^T W_{k,R} R_{i-j}  +  u^T k_j  +  v^T W_{k,R} R_{i-j}
            = (q_i + u) . k_j  +  (q_i + v) . W_{k,R} R_{i-j}                  (terms a+c, b+d)

scaled by 1/sqrt(d_head), with ``R`` the [sin | cos] sinusoid (Vaswani et al. 2017) over the
distances ``Tk-1 ... 0``, ``W_{k,R}`` (``r_proj``) its own bias-free projection, ``u`` the content
bias (``r_w_bias`` in the official code) and ``v`` the position bias (``r_r_bias``). No absolute
positions are used anywhere. This module is also the attention of the Compressive Transformer
(Rae et al. 2019, arXiv 1911.05507), whose keys are [compressed memory; memory; segment].

How it maps onto the one interface (docs/design.md)
---------------------------------------------------
``forward(x, *, kv, mask, state=None, positions)``:

- ``x`` (B, Tq, D): the current segment, queries come from here.
- ``kv`` (B, Tk, D): ``concat(memory, x)`` (Compressive: ``concat(cmem, mem, x)``), built by the
  *model*, which owns the memory bookkeeping. We pass the memory through ``kv`` and not ``state``
  (a deliberate deviation from the design table's "state in/out" row): the memory of a layer is
  that layer's *input* (before the pre-LN norm when ``norm_first``), and :class:`TransformerBlock`
  applies its norm to ``kv`` exactly as the official code applies ``layer_norm`` to
  ``cat(mems, w)``. The module is therefore stateless: ``state`` must be ``None``.
- ``mask``: must be causal (the shift trick is causal-only: the values above the diagonal are
  garbage, espnet #2684). The interface's alignment "query i sees key j iff j <= i + Tk - Tq" is
  exactly XL's ``j <= i + mlen``. ``key_padding`` is honoured.
- ``positions``: a :class:`RelativePositions` the model computes once per forward: ``r`` (Tk, D)
  (clamped at ``clamp_len``, dropout applied), the shared ``u``/``v`` when they are tied across
  layers, and ``max_distance`` for ``same_length``. With ``untie_r`` each layer owns its ``u``/``v``
  and ``positions.u``/``positions.v`` are ``None``.

Shift trick (official ``_rel_shift``): compute ``B[i, m] = (q_i + v) . W_R R[m]`` for every query
and every row ``m`` of R (O(Tq * Tk) memory, no gather), pad one zero column on the left, view as
(Tk + 1, Tq), drop the first row, view back as (Tq, Tk). Then ``out[i, j] = B[i, j + Tq - 1 - i]``,
i.e. distance ``i + mlen - j`` for every ``j <= i + mlen``; entries above that diagonal are
meaningless and masked.

Deviations: the attention itself is computed by ``scaled_dot_product_attention`` with the content
bias folded into the query and the positional term passed as an additive float mask (same maths,
fused kernel); :meth:`RelativeXLAttention.attention_probs` computes the same probabilities
explicitly (the Compressive "most-used" compression and tests use it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
    keep_init,
)
from .registry import register_attention
from .sinusoid import sinusoid_table

__all__ = [
    "RelativeXLConfig",
    "RelativePositions",
    "RelativeXLAttention",
    "RelativeShared",
    "rel_shift",
    "relative_keep_mask",
]


@dataclass(frozen=True, kw_only=True)
class RelativeXLConfig(AttentionConfig):
    """Transformer-XL relative attention. ``untie_r``: every layer owns its u/v (otherwise the
    layers of a model share one pair); ``clamp_len``: distances above it share one encoding;
    ``same_length``: every query sees ``memory_len + 1`` keys (TF convention). In
    :class:`~effiformer.models.transformer_xl.XLConfig` these three mirror the model config's
    fields of the same names (set them there). ``r_init_std`` (an ablation, not the method;
    ``None``, the default, leaves ``W_{k,R}`` to the model's weight init as every other matrix,
    as the official code does): ``W_{k,R}`` starts N(0, r_init_std) instead, kept through the
    model's init; 0 starts the position terms (b) and (d) at zero, so the part starts as content
    attention with the ``u`` bias and learns its distance preferences."""

    name = "relative_xl"

    untie_r: bool = False
    clamp_len: int | None = None
    same_length: bool = False
    r_init_std: float | None = None

    def __post_init__(self) -> None:
        r = self.r_init_std
        if r is not None and (isinstance(r, bool) or not isinstance(r, int | float) or r < 0):
            raise ConfigError(f"attention.r_init_std must be None or a number >= 0, got {r!r}")
        if self.clamp_len is not None and (
            isinstance(self.clamp_len, bool)
            or not isinstance(self.clamp_len, int)
            or self.clamp_len < 0
        ):
            raise ConfigError(
                f"attention.clamp_len must be None or an int >= 0, got {self.clamp_len!r}"
            )


class RelativeShared(nn.Module):
    """What the layers of one model share: u/v (unless ``untie_r``) and the dropout on R."""

    def __init__(self, n_heads: int, head_dim: int, *, tied: bool, dropout: float) -> None:
        super().__init__()
        if tied:
            self.u_bias = nn.Parameter(torch.empty(n_heads, head_dim))
            self.v_bias = nn.Parameter(torch.empty(n_heads, head_dim))
            nn.init.normal_(self.u_bias, std=0.02)
            nn.init.normal_(self.v_bias, std=0.02)
        else:
            self.register_parameter("u_bias", None)
            self.register_parameter("v_bias", None)
        self.drop = nn.Dropout(dropout)

    def make_dense_equivalent_(self) -> None:
        with torch.no_grad():
            for p in (self.u_bias, self.v_bias):
                if p is not None:
                    p.zero_()


@dataclass(frozen=True)
class RelativePositions:
    """Positional inputs shared by all layers of one forward.

    r: (Tk, D) sinusoid for the distances ``Tk-1, ..., 0`` (row ``m`` is distance ``Tk-1-m``).
    u, v: (H, Dh) content and position biases shared across layers, or ``None`` when every layer
        owns its own (``untie_r``).
    max_distance: ``same_length``: query ``i`` sees key ``j`` only if its distance is at most this
        (so every query sees ``max_distance + 1`` keys once the memory is full); ``None``: off.
    """

    r: Tensor
    u: Tensor | None = None
    v: Tensor | None = None
    max_distance: int | None = None


def rel_shift(x: Tensor) -> Tensor:
    """(..., Tq, Tk) -> (..., Tq, Tk): ``out[..., i, j] = x[..., i, j + Tq - 1 - i]`` for
    ``j <= i + Tk - Tq``; entries above that diagonal are garbage and must be masked."""
    *lead, tq, tk = x.shape
    pad = x.new_zeros(*lead, tq, 1)
    xp = torch.cat([pad, x], dim=-1)  # (..., Tq, Tk + 1)
    xp = xp.view(*lead, tk + 1, tq)  # (..., Tk + 1, Tq)
    return xp[..., 1:, :].reshape(*lead, tq, tk)  # (..., Tq, Tk)


def relative_keep_mask(
    tq: int,
    tk: int,
    *,
    max_distance: int | None = None,
    key_padding: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """Keep-mask (True = attend), (1 or B, 1, Tq, Tk): causal with queries aligned to the last
    ``Tq`` keys, optionally limited to distances ``<= max_distance`` (``same_length``)."""
    qi = torch.arange(tq, device=device)[:, None] + (tk - tq)  # query's own key position
    kj = torch.arange(tk, device=device)[None, :]
    dist = qi - kj  # (Tq, Tk)
    keep = dist >= 0
    if max_distance is not None:
        keep = keep & (dist <= max_distance)
    keep = keep[None, None]  # (1, 1, Tq, Tk)
    if key_padding is not None:
        keep = keep & key_padding[:, None, None, :].to(torch.bool)  # (B, 1, Tq, Tk)
    return keep


class RelativeXLAttention(AttentionPart):
    """Relative multi-head attention (Transformer-XL eq. in sec. 3.3).

    Args:
        dim: model width D.
        n_heads: H.
        head_dim: Dh.
        dropout: dropout on the attention weights (``dropatt``), training only.
        own_biases: ``True`` (``untie_r``): this layer owns its ``u`` and ``v``; ``False``: they
            come from ``positions`` (shared across layers, the official PyTorch default).

    All projections (q, k, v, ``W_{k,R}`` and the output) are bias-free, as in the official code.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        *,
        dropout: float = 0.0,
        own_biases: bool = False,
    ) -> None:
        super().__init__()
        self.dim, self.n_heads, self.head_dim = dim, n_heads, head_dim
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(dim, inner, bias=False)
        self.k_proj = nn.Linear(dim, inner, bias=False)
        self.v_proj = nn.Linear(dim, inner, bias=False)
        self.r_proj = nn.Linear(dim, inner, bias=False)  # W_{k,R}
        self.o_proj = nn.Linear(inner, dim, bias=False)
        self.dropout = dropout
        if own_biases:
            self.u_bias = nn.Parameter(torch.zeros(n_heads, head_dim))
            self.v_bias = nn.Parameter(torch.zeros(n_heads, head_dim))
            nn.init.normal_(self.u_bias, std=0.02)
            nn.init.normal_(self.v_bias, std=0.02)
        else:
            self.register_parameter("u_bias", None)
            self.register_parameter("v_bias", None)
        self.config = RelativeXLConfig(untie_r=own_biases)
        self.dims = AttentionDims(dim, n_heads, head_dim, causal=True, dropout=dropout)

    # ---- registered-part interface -----------------------------------------------------------

    @classmethod
    def from_config(cls, config: RelativeXLConfig, dims: AttentionDims) -> RelativeXLAttention:
        m = cls(
            dims.dim, dims.n_heads, dims.head_dim, dropout=dims.dropout, own_biases=config.untie_r
        )
        m.config, m.dims = config, dims
        if config.r_init_std is not None:  # the ablation: W_{k,R}'s own start, kept
            with torch.no_grad():
                m.r_proj.weight.normal_(0.0, config.r_init_std)
            keep_init(m.r_proj.weight)
        return m

    @classmethod
    def build_shared(cls, config: RelativeXLConfig, dims: AttentionDims) -> RelativeShared:
        return RelativeShared(
            dims.n_heads, dims.head_dim, tied=not config.untie_r, dropout=dims.residual_dropout
        )

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> RelativePositions:
        """R over the distances ``Tk-1 ... 0`` (clamped at ``clamp_len``, dropout applied once
        for every layer), the shared u/v, and the ``same_length`` window."""
        if not isinstance(shared, RelativeShared):
            raise TypeError("relative_xl's prepare needs the module from build_shared()")
        c = self.config
        dist = torch.arange(ctx.tk - 1, -1, -1, device=ctx.device)  # (Tk,): Tk-1 ... 0
        if c.clamp_len is not None:
            dist = dist.clamp(max=c.clamp_len)
        r = shared.drop(sinusoid_table(dist, self.dim).to(ctx.dtype))  # (Tk, D)
        return RelativePositions(
            r=r,
            u=shared.u_bias,
            v=shared.v_bias,
            max_distance=ctx.memory_len if c.same_length else None,
        )

    def make_dense_equivalent_(self) -> None:
        """W_R = 0 and u = v = 0: the scores reduce to q.k / sqrt(Dh)."""
        with torch.no_grad():
            self.r_proj.weight.zero_()
            for p in (self.u_bias, self.v_bias):
                if p is not None:
                    p.zero_()

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _biases(self, positions: RelativePositions) -> tuple[Tensor, Tensor]:
        if self.u_bias is not None:
            if positions.u is not None or positions.v is not None:
                raise ValueError(
                    "this layer owns its u/v biases (untie_r); positions.u and positions.v must "
                    "be None"
                )
            return self.u_bias, self.v_bias
        if positions.u is None or positions.v is None:
            raise ValueError(
                "this layer shares u/v across layers; positions.u and positions.v must be "
                f"({self.n_heads}, {self.head_dim}) tensors"
            )
        return positions.u, positions.v

    def _check(
        self,
        x: Tensor,
        kv: Tensor | None,
        mask: AttentionMask | None,
        state: object,
        positions: object,
    ) -> tuple[Tensor, RelativePositions, AttentionMask]:
        check_attention_inputs(x, kv, self.dim, mask)
        if state is not None:
            raise ValueError(
                "RelativeXLAttention is stateless: pass the memory as kv=concat(memory, x), "
                "state=None"
            )
        if not isinstance(positions, RelativePositions):
            raise TypeError(
                "positions must be a RelativePositions with r of shape (Tk, D), got "
                f"{type(positions).__name__}"
            )
        if mask is None or not mask.causal:
            raise ValueError(
                "RelativeXLAttention needs mask=AttentionMask(causal=True): the relative shift "
                "trick is only valid on the causal region"
            )
        src = x if kv is None else kv
        tk = src.shape[1]
        if positions.r.shape != (tk, self.dim):
            raise ValueError(
                f"positions.r must be (Tk={tk}, D={self.dim}), got {tuple(positions.r.shape)}"
            )
        return src, positions, mask

    def _scores_parts(
        self, x: Tensor, src: Tensor, positions: RelativePositions, mask: AttentionMask
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Query with the content bias folded in, keys, values and the additive positional term
        (scaled, masked with -inf), shapes (B,H,Tq,Dh), (B,H,Tk,Dh) x2, (B or 1,H,Tq,Tk)."""
        tq, tk = x.shape[1], src.shape[1]
        u, v = self._biases(positions)
        q = self._heads(self.q_proj(x))  # (B, H, Tq, Dh)
        k = self._heads(self.k_proj(src))  # (B, H, Tk, Dh)
        val = self._heads(self.v_proj(src))  # (B, H, Tk, Dh)
        # W_R R scaled by 1/sqrt(Dh) here, on the small (Tk, H*Dh) table, rather than on the
        # (B, H, Tq, Tk) scores.
        r = self.r_proj(positions.r) * self.head_dim**-0.5
        r = r.view(tk, self.n_heads, self.head_dim).transpose(0, 1)  # (H, Tk, Dh)
        bd = (q + v[None, :, None, :]) @ r.transpose(-1, -2)  # (B, H, Tq, Tk) over R rows
        bd = rel_shift(bd)  # (B, H, Tq, Tk) over keys, scaled
        keep = relative_keep_mask(
            tq,
            tk,
            max_distance=positions.max_distance,
            key_padding=mask.key_padding,
            device=x.device,
        )
        bias = bd.masked_fill(~keep, float("-inf"))
        return q + u[None, :, None, :], k, val, bias

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: RelativePositions | None = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D); kv: (B, Tk, D) = memory ++ x (None = x) -> out (B, Tq, D)."""
        src, positions, mask = self._check(x, kv, mask, state, positions)
        qu, k, val, bias = self._scores_parts(x, src, positions, mask)
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(qu, k, val, attn_mask=bias, dropout_p=p)  # (B,H,Tq,Dh)
        o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)  # (B, Tq, H*Dh)
        return AttentionOutput(out=self.o_proj(o))

    def attention_probs(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        positions: RelativePositions | None = None,
    ) -> Tensor:
        """The attention weights ``forward`` uses (before dropout), (B, H, Tq, Tk), computed
        explicitly: softmax((q + u) k^T / sqrt(Dh) + positional term)."""
        src, positions, mask = self._check(x, kv, mask, None, positions)
        qu, k, _, bias = self._scores_parts(x, src, positions, mask)
        scores = (qu @ k.transpose(-1, -2)) * self.head_dim**-0.5 + bias  # (B, H, Tq, Tk)
        work = torch.promote_types(scores.dtype, torch.float32)
        return torch.softmax(scores.to(work), dim=-1).to(scores.dtype)

    def content_attention(self, h: Tensor, mem: Tensor, *, detach_weights: bool = True) -> Tensor:
        """Content-only attention of ``h`` (B, Tq, D) over ``mem`` (B, Tm, D) with this layer's
        query/key/value weights, no positions, no mask, no biases -> (B, Tq, H*Dh) (before the
        output projection). With ``detach_weights`` the weights are stop-gradiented: this is the
        ``attn`` of the Compressive Transformer's attention-reconstruction loss (Algorithm 2)."""
        wq, wk, wv = self.q_proj.weight, self.k_proj.weight, self.v_proj.weight
        if detach_weights:
            wq, wk, wv = wq.detach(), wk.detach(), wv.detach()
        q = self._heads(F.linear(h, wq))  # (B, H, Tq, Dh)
        k = self._heads(F.linear(mem, wk))  # (B, H, Tm, Dh)
        v = self._heads(F.linear(mem, wv))  # (B, H, Tm, Dh)
        o = F.scaled_dot_product_attention(q, k, v)  # (B, H, Tq, Dh)
        return o.transpose(1, 2).reshape(h.shape[0], h.shape[1], -1)  # (B, Tq, H*Dh)


register_attention(
    "relative_xl",
    RelativeXLConfig,
    RelativeXLAttention,
    modes=("causal",),
    description="Transformer-XL relative attention with the shift trick (Dai et al. 2019)",
)
