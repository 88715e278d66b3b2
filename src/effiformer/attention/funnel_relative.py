"""Funnel-Transformer relative multi-head attention.

Dai, Lai, Yang, Le 2020, "Funnel-Transformer", arXiv 2006.03236, appendix A.2 (relative
attention with a token-type term), following the official code (laiguokun/Funnel-Transformer,
``pytorch/ops.py: RelMultiheadAttention``). Per head, with the query pre-scaled by
``s = 1/sqrt(d_head)`` *before* the biases are added and the biases scaled by the same factor:

    score_ij = s (q_i + u)·k_j                                   content
             + s (q_i + v)·W_r R(pos_i - pos_j)                  position   (cls-masked)
             + s (q_i + w)·seg_embed[same_segment_ij]            token type (cls-masked)

u, v, w are ``r_w_bias``, ``r_r_bias``, ``r_s_bias`` (H, Dh); ``W_r`` is ``r_kernel``
(D, H, Dh); ``seg_embed`` is (2, H, Dh) with index 0 = different, 1 = same segment; R is the
[sin | cos] sinusoid of width D (the model width, not the head width). Two tokens are in the
same segment when their token types match or either is [CLS] (type 2). The q projection has no
bias; k, v and the output projection have biases. With ``cls_first`` the position and
token-type terms are zeroed on row 0 and column 0 ([CLS]), the official ``func_mask``: [CLS]
attends, and is attended to, by content only.

The positional term has two equivalent forms (:class:`FunnelPositions`, ``kind``):

- ``"relative_shift"`` (GPU form, the default): project the encodings of every distance the
  layer can see, ``(q+v)·W_r R_t`` over a descending distance table of length ``Tk + shift*Tq``,
  then read entry (i, j) at column ``shift*(Tq - i) + j``. ``shift`` is 2 when pooled queries
  attend to unpooled keys, 1 otherwise. Sinusoid dropout acts on the distance table.
- ``"factorized"`` (TPU form): sin(a - b) and cos(a - b) expanded into query-side and key-side
  factors, [sin|sin], [cos|cos] against [cos|sin], [-sin|cos]; sinusoid dropout acts on the
  query-side factors. It costs D (not Dh) per query-key pair.

Funnel is bidirectional, so the distance table has both signs (Transformer-XL's causal shift
would be wrong here).

How it is computed (:meth:`FunnelRelativeAttention.forward`). :meth:`~FunnelRelativeAttention.scores`
is the textbook form above, used by tests; ``forward`` computes the same softmax with less
memory traffic:

- One stored query, ``qu = s(q + u)``: the position query ``s(q + v)`` and the token-type query
  ``s(q + w)`` differ from it by per-head constants and are rebuilt from it where needed.
- Everything except the relative-shift term is low rank in (i, j): the token-type term (2 feature
  columns: type ids are 0, 1 or 2) and, for the factorized form, the positional factors (D
  columns) join the ``q·k`` product as extra columns; the [CLS]-column correction is added to
  column 0 and the key padding as a (B, 1, 1, Tk) bias of -1e6. The cls-mask on row 0 is
  applied by zeroing query 0's position/segment terms. Per-row constants (the same-segment
  score) are dropped, which softmax cannot see; the [CLS] column correction keeps each row exact.
- The scores are formed in query chunks (flash-attention style): each chunk's relative-shift
  term is computed against only the ``Tk + shift*c`` distances it needs, the content and feature
  columns are added by ``baddbmm``, then one fused softmax and P·V. Only the inputs (the heads'
  views of the projections, not copies) and the output are kept; the backward pass recomputes
  each chunk's softmax (dropout masks are re-drawn from the same seed) and scatters the score
  gradient back to the distance table. No (B, H, Tq, 2Tk) tensor exists and no (B, H, Tq, Tk)
  tensor outlives a chunk, so a layer stores about what a dense layer on
  ``scaled_dot_product_attention`` stores.

Deliberate deviations: padding is masked with an additive ``-1e6`` like the official code (not
``-inf``), so a row whose keys are all padding stays finite; half precision inputs are scored in
float32 (the official "precision safe" softmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from ..ops.funnel_core import NEG_INF, funnel_attention_core, relative_shift
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
)
from .registry import register_attention

__all__ = [
    "ATTENTION_TYPES",
    "FunnelAttentionConfig",
    "FunnelPositions",
    "FunnelRelativeAttention",
    "relative_shift",
    "relative_distances",
    "progression_distances",
    "rel_sinusoid",
    "NEG_INF",
]

ATTENTION_TYPES = ("relative_shift", "factorized")
CLS_TYPE = 2


@dataclass(frozen=True, kw_only=True)
class FunnelAttentionConfig(AttentionConfig):
    """Funnel relative attention. ``kind``: "relative_shift" (GPU form, default) or
    "factorized" (TPU form), the official ``attention_type``; ``init_range``: U(0, init_range)
    for the relative-attention parameters (the official ``initializer_range``)."""

    name = "funnel_relative"

    kind: str = "relative_shift"
    init_range: float = 0.1

    def __post_init__(self) -> None:
        self._check_choice("kind", ATTENTION_TYPES)
        if not self.init_range > 0:
            raise ConfigError(f"attention.init_range must be > 0, got {self.init_range!r}")


def rel_sinusoid(distances: Tensor, dim: int) -> Tensor:
    """(R,) distances -> (R, dim) ``[sin(d f_k) | cos(d f_k)]``, f_k = 10000^(-k/(dim/2)), in float64."""
    if dim % 2:
        raise ValueError(f"the model width must be even for the sinusoid, got dim={dim}")
    half = dim // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = distances.to(torch.float64)[:, None] * inv_freq.to(distances.device)[None]  # (R, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_distances(q_pos: Tensor, k_pos: Tensor, shift: int) -> Tensor:
    """Descending distance table (Tk + shift*Tq,) used by the relative-shift form.

    Positions must be evenly spaced: q_pos with stride ``shift * k_stride``, k_pos with stride
    ``k_stride``. Entry ``shift*(Tq - i) + j`` of the table is ``q_pos[i] - k_pos[j]``.
    """
    k_stride = int(k_pos[1] - k_pos[0]) if k_pos.numel() > 1 else 1
    tq = q_pos.numel()
    top = int(q_pos[0] - k_pos[0]) + shift * tq * k_stride
    bottom = int(q_pos[0] - k_pos[-1])
    return torch.arange(top, bottom - 1, -k_stride, dtype=torch.long, device=q_pos.device)


def progression_distances(
    q_first: int, k_first: int, k_step: int, tq: int, tk: int, shift: int, device=None
) -> Tensor:
    """:func:`relative_distances` for positions given as integers (queries from ``q_first``,
    ``tq`` of them; keys ``k_first + j * k_step``, ``tk`` of them): no tensor is read."""
    k_step = k_step if tk > 1 else 1
    top = (q_first - k_first) + shift * tq * k_step
    bottom = q_first - (k_first + (tk - 1) * k_step)
    return torch.arange(top, bottom - 1, -k_step, dtype=torch.long, device=device)


@dataclass(frozen=True)
class FunnelPositions:
    """Positional and segment inputs of one Funnel attention call, computed once by the model.

    kind: "relative_shift" or "factorized".
    rel: (Tk + shift*Tq, D) sinusoids of the descending distance table (relative_shift),
        dropout applied; see :func:`relative_distances`.
    shift: 1 (queries and keys at the same stride) or 2 (pooled queries, unpooled keys).
    enc: (sin_q, cos_q, sin_k, cos_k) of shapes (Tq, D/2), (Tq, D/2), (Tk, D/2), (Tk, D/2)
        (factorized); the query pair carries the dropout.
    q_types, k_types: (B, Tq), (B, Tk) token type ids (0, 1, or 2 for [CLS]) of the queries and
        keys, or ``None`` for one segment everywhere.
    cls_first: zero the position and token-type terms on row 0 and column 0 ([CLS]).
    """

    kind: str
    rel: Tensor | None = None
    shift: int = 1
    enc: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
    q_types: Tensor | None = None
    k_types: Tensor | None = None
    cls_first: bool = True


class FunnelRelativeAttention(AttentionPart):
    """Funnel relative attention behind the common interface.

    forward(x (B, Tq, D), *, kv (B, Tk, D) | None, mask: AttentionMask | None,
            positions: FunnelPositions) -> AttentionOutput(out (B, Tq, D)).
    ``kv`` is the unpooled state in the first layer of a pooled block (pool-query-only).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        *,
        dropout: float = 0.0,
        init_range: float = 0.1,
    ) -> None:
        super().__init__()
        self.dim, self.n_heads, self.head_dim = dim, n_heads, head_dim
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(dim, inner, bias=False)
        self.k_proj = nn.Linear(dim, inner)
        self.v_proj = nn.Linear(dim, inner)
        self.o_proj = nn.Linear(inner, dim)
        self.r_w_bias = nn.Parameter(torch.empty(n_heads, head_dim))
        self.r_r_bias = nn.Parameter(torch.empty(n_heads, head_dim))
        self.r_s_bias = nn.Parameter(torch.empty(n_heads, head_dim))
        self.r_kernel = nn.Parameter(torch.empty(dim, n_heads, head_dim))
        self.seg_embed = nn.Parameter(torch.empty(2, n_heads, head_dim))
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(head_dim)
        self.init_range = init_range
        self.reset_relative_parameters()
        self.config = FunnelAttentionConfig(init_range=init_range)
        self.dims = AttentionDims(dim, n_heads, head_dim, causal=False, dropout=dropout)

    # ------------------------------------------------------------------ registered part

    @classmethod
    def from_config(
        cls, config: FunnelAttentionConfig, dims: AttentionDims
    ) -> FunnelRelativeAttention:
        m = cls(
            dims.dim,
            dims.n_heads,
            dims.head_dim,
            dropout=dims.dropout,
            init_range=config.init_range,
        )
        m.config, m.dims = config, dims
        return m

    @classmethod
    def build_shared(cls, config: FunnelAttentionConfig, dims: AttentionDims) -> nn.Module:
        """The dropout on the sinusoids (the model's ``dropout``, drawn once per table)."""
        return nn.Dropout(dims.residual_dropout)

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> FunnelPositions:
        """:class:`FunnelPositions` for queries at ``ctx.q_positions`` and keys at
        ``ctx.k_positions``. ``ctx.extra`` may give ``shift`` (2: pooled queries over unpooled
        keys; default 1), ``q_types`` / ``k_types`` (B, T) token type ids, ``cls_first``
        (default False) and ``seq_len`` (the unpooled length; default Tk).

        relative_shift: the sinusoids of every distance in [-2T, 2T) are drawn once per model
        forward (one dropout draw, kept in ``ctx.scratch``) and indexed by each call's descending
        distance table, as the official code; factorized: query-side factors carry a fresh
        dropout draw per call."""
        drop = shared if shared is not None else nn.Identity()
        q_pos, k_pos = ctx.query_positions(), ctx.key_positions()
        if ctx.q_positions is None and ctx.tq != ctx.tk:
            raise ValueError("funnel_relative needs ctx.q_positions when Tq != Tk")
        extra = ctx.extra
        shift = int(extra.get("shift", 1))
        common = {
            "q_types": extra.get("q_types"),
            "k_types": extra.get("k_types"),
            "cls_first": bool(extra.get("cls_first", False)),
        }
        if self.config.kind == "relative_shift":
            seq_len = int(extra.get("seq_len", ctx.tk))
            key = ("funnel_relative.table", seq_len, self.dim, ctx.dtype, ctx.device)
            table = ctx.scratch.get(key)
            if table is None:
                dist = torch.arange(-2 * seq_len, 2 * seq_len, device=ctx.device)
                table = drop(rel_sinusoid(dist, self.dim).to(ctx.dtype))  # (4T, D)
                ctx.scratch[key] = table
            qp, kp = extra.get("q_progression"), extra.get("k_progression")
            if qp is not None and kp is not None:  # integers: no tensor read
                dist = progression_distances(qp[0], kp[0], kp[1], qp[2], kp[2], shift, ctx.device)
                lo = qp[0] - (kp[0] + (kp[2] - 1) * (kp[1] if kp[2] > 1 else 1))
                hi = (qp[0] - kp[0]) + shift * qp[2] * (kp[1] if kp[2] > 1 else 1)
            else:
                dist = relative_distances(q_pos, k_pos, shift)
                lo, hi = int(dist.min()), int(dist.max())
            dist = dist + 2 * seq_len
            if lo + 2 * seq_len < 0 or hi + 2 * seq_len >= table.shape[0]:
                raise ValueError(
                    f"relative distances outside the sinusoid table of seq_len={seq_len}"
                )
            return FunnelPositions("relative_shift", rel=table[dist], shift=shift, **common)
        sq, cq = rel_sinusoid(q_pos, self.dim).to(ctx.dtype).chunk(2, dim=-1)  # (Tq, D/2)
        sk, ck = rel_sinusoid(k_pos, self.dim).to(ctx.dtype).chunk(2, dim=-1)  # (Tk, D/2)
        enc = (drop(sq), drop(cq), sk, ck)  # dropout on the query side, as official
        return FunnelPositions("factorized", enc=enc, shift=shift, **common)

    def make_dense_equivalent_(self) -> None:
        """Zero every relative parameter: the scores reduce to s q.k (content only)."""
        with torch.no_grad():
            for p in (self.r_w_bias, self.r_r_bias, self.r_s_bias, self.r_kernel, self.seg_embed):
                p.zero_()

    def reset_relative_parameters(self) -> None:
        """U(0, init_range), the official ``nn.init.uniform_(b=0.1)``."""
        for p in (self.r_w_bias, self.r_r_bias, self.r_s_bias, self.r_kernel, self.seg_embed):
            nn.init.uniform_(p, 0.0, self.init_range)

    # ------------------------------------------------------------------ shared pieces

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _check(self, x, kv, mask, state, positions) -> tuple[int, int, int]:
        check_attention_inputs(x, kv, self.dim, mask)
        if state is not None:
            raise ValueError("FunnelRelativeAttention takes no state; pass state=None")
        if not isinstance(positions, FunnelPositions):
            raise ValueError(
                "FunnelRelativeAttention needs positions=FunnelPositions(...) from the model, "
                f"got {type(positions).__name__}"
            )
        if positions.kind not in ATTENTION_TYPES:
            raise ValueError(
                f"positions.kind must be one of {list(ATTENTION_TYPES)}, got {positions.kind!r}"
            )
        if mask is not None and mask.causal:
            raise ValueError("Funnel attention is bidirectional; mask.causal must be False")
        b, tq = x.shape[:2]
        tk = (x if kv is None else kv).shape[1]
        for name, t, n in (("q_types", positions.q_types, tq), ("k_types", positions.k_types, tk)):
            if t is not None and t.shape != (b, n):
                raise ValueError(f"positions.{name} must be (B={b}, {n}), got {tuple(t.shape)}")
        if (positions.q_types is None) != (positions.k_types is None):
            raise ValueError("positions.q_types and positions.k_types must be given together")
        if positions.kind == "relative_shift":
            if positions.rel is None or positions.rel.shape != (
                tk + positions.shift * tq,
                self.dim,
            ):
                got = None if positions.rel is None else tuple(positions.rel.shape)
                raise ValueError(
                    f"positions.rel must be (Tk + shift*Tq = {tk + positions.shift * tq}, "
                    f"{self.dim}), got {got}"
                )
        elif positions.enc is None or len(positions.enc) != 4:
            raise ValueError("factorized positions need enc=(sin_q, cos_q, sin_k, cos_k)")
        return b, tq, tk

    def _project(self, x: Tensor, kv: Tensor | None):
        src = x if kv is None else kv
        q = self._heads(self.q_proj(x)) * self.scale  # (B, H, Tq, Dh), scaled before the biases
        k = self._heads(self.k_proj(src))  # (B, H, Tk, Dh)
        v = self._heads(self.v_proj(src))  # (B, H, Tk, Dh)
        return q, k, v

    def _r_head(self, positions: FunnelPositions, dtype: torch.dtype) -> Tensor:
        """W_r R_t for every distance of the table: (H, R, Dh)."""
        return torch.einsum("td,dnh->nth", positions.rel.to(dtype), self.r_kernel.to(dtype))

    def _factors(self, qv: Tensor, positions: FunnelPositions) -> tuple[Tensor, Tensor]:
        """Factorized form: query factors (B, H, Tq, D) and key factors (Tk, D) whose product is
        the positional term: sum_k C_j (a s_i + b c_i) + S_j (b s_i - a c_i), [a | b] = W_r(q+v).
        """
        sq, cq, sk, ck = (e.to(qv.dtype) for e in positions.enc)
        qr = torch.einsum("bnih,dnh->bnid", qv, self.r_kernel.to(qv.dtype))  # (B, H, Tq, D)
        a, b = qr.chunk(2, dim=-1)  # sin and cos coefficients, (B, H, Tq, D/2)
        f = torch.cat([a * sq + b * cq, b * sq - a * cq], dim=-1)  # (B, H, Tq, D)
        g = torch.cat([ck, sk], dim=-1)  # (Tk, D)
        return f, g

    def _seg_scores(self, q: Tensor, *, from_qu: bool = False) -> tuple[Tensor, Tensor]:
        """s(q + w)·seg_embed: scores for a different and the same segment, (B, H, Tq) each.

        ``q`` is the scaled query ``s q``, or with ``from_qu`` the content query ``s(q + u)``
        (then ``(w - u)s`` is added instead of ``w s``; the product stores only ``q``)."""
        seg_embed = self.seg_embed.to(q.dtype)
        bias = self.r_s_bias - self.r_w_bias if from_qu else self.r_s_bias
        const = ((bias * self.scale)[None] * seg_embed).sum(-1)  # (2, H)
        # Elementwise products (not einsum, whose reshapes would store copies of q): (B, H, Tq).
        diff = (q * seg_embed[0][:, None]).sum(-1) + const[0][:, None]
        same = (q * seg_embed[1][:, None]).sum(-1) + const[1][:, None]
        return diff, same

    # ------------------------------------------------------------------ textbook form

    def scores(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        positions: FunnelPositions | None = None,
    ) -> Tensor:
        """The attention scores (B, H, Tq, Tk) exactly as written in the module docstring, with
        the padding added as -1e6: the reference :meth:`forward` is tested against."""
        self._check(x, kv, mask, None, positions)
        q, k, _ = self._project(x, kv)
        tk = k.shape[2]
        content = (q + (self.r_w_bias * self.scale)[:, None, :]) @ k.transpose(-1, -2)
        qv = q + (self.r_r_bias * self.scale)[:, None, :]
        if positions.kind == "relative_shift":
            full = qv @ self._r_head(positions, q.dtype).transpose(-1, -2)[None]  # (B, H, Tq, R)
            pos = relative_shift(full, tk, positions.shift)
        else:
            f, g = self._factors(qv, positions)
            pos = f @ g.t()
        diff, same = self._seg_scores(q)
        if positions.q_types is None:
            seg = same[..., None].expand_as(pos)
        else:
            tq_, tk_ = positions.q_types[:, :, None], positions.k_types[:, None, :]
            same_seg = (tq_ == tk_) | (tq_ == CLS_TYPE) | (tk_ == CLS_TYPE)  # (B, Tq, Tk)
            seg = torch.where(same_seg[:, None], same[..., None], diff[..., None])
        extra = pos + seg
        if positions.cls_first:
            cls_mask = torch.ones_like(extra)
            cls_mask[..., 0, :] = 0
            cls_mask[..., :, 0] = 0
            extra = extra * cls_mask
        out = content + extra
        if mask is not None and mask.key_padding is not None:
            out = out.masked_fill(~mask.key_padding.to(torch.bool)[:, None, None, :], NEG_INF)
        return out

    # ------------------------------------------------------------------ fused form

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: FunnelPositions | None = None,
    ) -> AttentionOutput:
        b, tq, tk = self._check(x, kv, mask, state, positions)
        out_dtype = x.dtype
        q, k, v = self._project(x, kv)
        if q.dtype in (torch.float16, torch.bfloat16):
            q, k, v = q.float(), k.float(), v.float()
        h = self.n_heads
        # Every term is built from qu = s(q + u) (one stored tensor); the position query
        # s(q + v) = qu + pb and the token-type query s(q + w) = qu + (w - u)s differ from it by
        # per-head constants.
        qu = q + (self.r_w_bias * self.scale)[:, None, :]  # (B, H, Tq, Dh)
        pb = (self.r_r_bias - self.r_w_bias) * self.scale  # (H, Dh)
        diff, same = self._seg_scores(qu, from_qu=True)  # (B, H, Tq)
        row = None
        if positions.cls_first:
            # cls-mask, row 0: query 0 gets no position or token-type score.
            row = torch.ones(tq, dtype=q.dtype, device=q.device)
            row[0] = 0
            diff, same = diff * row, same * row
        qf, kf = [], []  # low-rank feature columns of the score matrix
        r = None
        if positions.kind == "relative_shift":
            r = self._r_head(positions, q.dtype)  # (H, Tk + shift*Tq, Dh)
            if positions.cls_first:
                # entry (i, 0) of the position term: (qu_i + pb)·r[shift*(Tq - i)]
                idx = positions.shift * (tq - torch.arange(tq, device=q.device))
                r0 = r[:, idx]  # (H, Tq, Dh)
                pos_col0 = ((qu * r0).sum(-1) + (pb[:, None] * r0).sum(-1)) * row
        else:
            qv = qu + pb[:, None, :]
            if row is not None:
                qv = qv * row[:, None]
            f, g = self._factors(qv, positions)
            qf.append(f)
            kf.append(g.expand(b, h, tk, g.shape[-1]))
            if positions.cls_first:
                pos_col0 = f @ g[0]  # (B, H, Tq)
        seg_col0 = torch.zeros_like(same)
        if positions.q_types is not None:
            # Token types: score diff where types 0 and 1 meet, same elsewhere; the row constant
            # `same` is dropped. Columns: -(same - diff)[t_i = 0] x [t_j = 1] and the mirror.
            t_q, t_k = positions.q_types, positions.k_types
            gap = same - diff
            for a, c in ((0, 1), (1, 0)):
                qcol = -gap * (t_q == a)[:, None].to(q.dtype)  # (B, H, Tq)
                kcol = (t_k == c)[:, None].to(q.dtype).expand(b, h, tk)  # (B, H, Tk)
                qf.append(qcol[..., None])
                kf.append(kcol[..., None])
                seg_col0 = seg_col0 + qcol * kcol[..., :1]
        corr = kb = None
        if positions.cls_first:
            # cls-mask, column 0: what makes entry (i, 0) content-only (minus the dropped row
            # constant `same`), (B, H, Tq).
            corr = -same - pos_col0 - seg_col0
        if mask is not None and mask.key_padding is not None:
            pad = (~mask.key_padding.to(torch.bool)).to(q.dtype) * NEG_INF  # (B, Tk)
            kb = pad[:, None, None, :]  # (B, 1, 1, Tk)
        qf_t = torch.cat(qf, dim=-1) if qf else None  # (B, H, Tq, F)
        kf_t = torch.cat(kf, dim=-1) if kf else None  # (B, H, Tk, F)
        p = self.dropout if self.training else 0.0
        seed = int(torch.randint(0, 2**62, (1,))) if p > 0.0 else 0
        o = funnel_attention_core(
            qu,
            k,
            v,
            qf_t,
            kf_t,
            corr,
            kb,
            r,
            None if r is None else pb,
            positions.cls_first,
            positions.shift,
            p,
            seed,
        )  # (B, H, Tq, Dh), laid out as (B, Tq, H, Dh)
        o = o.transpose(1, 2).reshape(b, tq, h * self.head_dim).to(out_dtype)
        return AttentionOutput(out=self.o_proj(o))


register_attention(
    "funnel_relative",
    FunnelAttentionConfig,
    FunnelRelativeAttention,
    modes=("bidirectional",),
    description="Funnel-Transformer relative attention with token-type terms (Dai et al. 2020)",
)
