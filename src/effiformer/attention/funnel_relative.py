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
[sin | cos] sinusoid of width D (the model width, not the head width), with dropout. The q
projection has no bias; k, v and the output projection have biases. With ``cls_first`` the
position and token-type terms are zeroed on row 0 and column 0 ([CLS]), the official
``func_mask``; so [CLS] attends, and is attended to, by content only.

The positional term has two equivalent forms (:class:`FunnelPositions`, ``kind``):

- ``"relative_shift"`` (GPU form, the default): project the encodings of all distances the
  layer can see once, ``(q+v)·W_r R_t`` for t over a descending distance table of length
  ``Tk + shift*Tq`` (B, H, Tq, R), then read entry (i, j) at column ``shift*(Tq - i) + j``.
  ``shift`` is 2 when pooled queries attend to unpooled keys, 1 otherwise. The shift is done
  with reshapes and narrows that are all views (no copy of the (B, H, Tq, R) tensor).
- ``"factorized"`` (TPU form): sin(a - b) and cos(a - b) expanded, query side [sin|sin] and
  [cos|cos] times key side [cos|sin] and [-sin|cos]; costs D (not Dh) per query-key pair.

Funnel is bidirectional, so the distance table has both signs (Transformer-XL's causal shift
would be wrong here).

Computation: the position and token-type terms form one additive float bias (B, H, Tq, Tk).
When no gradient is needed (inference) it is passed to the fused
``F.scaled_dot_product_attention`` as ``attn_mask``. In training the bias needs a gradient,
which the fused CPU kernels cannot give (PyTorch then falls back to its slower math path), so
the scores are formed with one ``baddbmm`` (bias + q k^T) and a small custom autograd function
does softmax -> dropout -> (P V), keeping only P and the dropout mask for the backward pass.

Deliberate deviations: padding is masked with an additive ``-1e6`` like the official code (not
``-inf``), so a row whose keys are all padding stays finite; the official code applies the
softmax in float32 ("precision safe"), which this module does for half precision inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import AttentionMask, AttentionOutput, check_attention_inputs

__all__ = [
    "FunnelPositions",
    "FunnelRelativeAttention",
    "relative_shift",
    "relative_distances",
    "rel_sinusoid",
    "factorized_encodings",
    "NEG_INF",
]

NEG_INF = -1e6
ATTENTION_TYPES = ("relative_shift", "factorized")


def rel_sinusoid(distances: Tensor, dim: int) -> Tensor:
    """(R,) distances -> (R, dim) ``[sin(d f_k) | cos(d f_k)]``, f_k = 10000^(-k/(dim/2))."""
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


def relative_shift(x: Tensor, tk: int, shift: int) -> Tensor:
    """(B, H, Tq, R) scores against the distance table -> (B, H, Tq, Tk) view.

    Entry (i, j) of the result is ``x[..., i, shift*(Tq - i) + j]``. Only views are used: the
    (Tq, R) block is read as (R, Tq), its first ``shift`` rows dropped (a contiguous slice), read
    back as (Tq, R - shift) and narrowed to Tk columns.
    """
    b, h, tq, r = x.shape
    if r < tk + shift * tq:
        raise ValueError(f"distance table of length {r} is shorter than Tk + shift*Tq")
    y = x.reshape(b, h, r, tq)[:, :, shift:]  # (B, H, R - shift, Tq), a contiguous slice
    y = y.reshape(b, h, tq, r - shift)  # (B, H, Tq, R - shift)
    return y[..., :tk]


def factorized_encodings(
    q_pos: Tensor, k_pos: Tensor, dim: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Query-side [sin|sin], [cos|cos] (Tq, D) and key-side [cos|sin], [-sin|cos] (Tk, D).

    sum_d a_d e1q_d e1k_d + a_d e2q_d e2k_d = a·[sin(pq - pk) | cos(pq - pk)] for any a (D,).
    """
    sq, cq = rel_sinusoid(q_pos, dim).chunk(2, dim=-1)
    sk, ck = rel_sinusoid(k_pos, dim).chunk(2, dim=-1)
    return (
        torch.cat([sq, sq], -1),
        torch.cat([cq, cq], -1),
        torch.cat([ck, sk], -1),
        torch.cat([-sk, ck], -1),
    )


@dataclass(frozen=True)
class FunnelPositions:
    """Positional and segment inputs of one Funnel attention call, computed once by the model.

    kind: "relative_shift" or "factorized".
    rel: (R, D) sinusoids of the descending distance table (relative_shift), dropout applied.
    shift: 1 (queries and keys at the same stride) or 2 (pooled queries, unpooled keys).
    enc: (enc_q_1, enc_q_2, enc_k_1, enc_k_2) of shapes (Tq, D), (Tq, D), (Tk, D), (Tk, D)
        (factorized); the query-side pair carries the dropout.
    same_segment: (B, Tq, Tk) bool, True where the token types match or either token is [CLS]
        (type id 2); ``None`` means every pair is in the same segment.
    cls_first: zero the position and token-type terms on row 0 and column 0 ([CLS]).
    """

    kind: str
    rel: Tensor | None = None
    shift: int = 1
    enc: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
    same_segment: Tensor | None = None
    cls_first: bool = True


class _SoftmaxDropoutMatmul(torch.autograd.Function):
    """out = dropout(softmax(scores)) @ v, saving only P = softmax(scores) and the keep mask."""

    @staticmethod
    def forward(ctx, scores: Tensor, v: Tensor, p: float, keep: Tensor | None) -> Tensor:
        probs = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk)
        if keep is not None:
            dropped = probs * keep * (1.0 / (1.0 - p))
            out = dropped @ v
        else:
            out = probs @ v
        ctx.p = p
        ctx.save_for_backward(probs, v, keep)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        probs, v, keep = ctx.saved_tensors
        scale = 1.0 / (1.0 - ctx.p)
        dropped = probs * keep * scale if keep is not None else probs
        grad_v = dropped.transpose(-1, -2) @ grad_out
        del dropped
        grad_p = grad_out @ v.transpose(-1, -2)  # (B, H, Tq, Tk)
        if keep is not None:
            grad_p.mul_(keep).mul_(scale)
        # softmax backward: dS = P * (dP - sum_j P dP)
        row = (grad_p * probs).sum(dim=-1, keepdim=True)
        grad_p.sub_(row).mul_(probs)
        return grad_p, grad_v, None, None


class FunnelRelativeAttention(nn.Module):
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

    def reset_relative_parameters(self) -> None:
        """U(0, init_range) as in the official code (``nn.init.uniform_(b=0.1)``)."""
        for p in (self.r_w_bias, self.r_r_bias, self.r_s_bias, self.r_kernel, self.seg_embed):
            nn.init.uniform_(p, 0.0, self.init_range)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def position_scores(self, q: Tensor, positions: FunnelPositions, tk: int) -> Tensor:
        """Positional term s (q + v)·W_r R(pos_i - pos_j) for pre-scaled q (B, H, Tq, Dh).

        Returns (B, H, Tq, Tk); for the relative-shift form this is a view, not a copy.
        """
        qv = q + (self.r_r_bias * self.scale)[:, None, :]  # (B, H, Tq, Dh)
        w_r = self.r_kernel.to(q.dtype)
        if positions.kind == "relative_shift":
            if positions.rel is None:
                raise ValueError("relative_shift positions need the distance table `rel`")
            r_head = torch.einsum("td,dnh->nth", positions.rel.to(q.dtype), w_r)  # (H, R, Dh)
            full = qv @ r_head.transpose(-1, -2)  # (B, H, Tq, R)
            return relative_shift(full, tk, positions.shift)
        if positions.kind == "factorized":
            if positions.enc is None:
                raise ValueError("factorized positions need the encodings `enc`")
            eq1, eq2, ek1, ek2 = (e.to(q.dtype) for e in positions.enc)
            qr = torch.einsum("bnih,dnh->bnid", qv, w_r)  # (B, H, Tq, D)
            return (qr * eq1) @ ek1.t() + (qr * eq2) @ ek2.t()  # (B, H, Tq, Tk)
        raise ValueError(
            f"positions.kind must be one of {list(ATTENTION_TYPES)}, got {positions.kind!r}"
        )

    def score_bias(self, q: Tensor, positions: FunnelPositions, tk: int) -> Tensor:
        """Position + token-type terms, cls-masked: (B, H, Tq, Tk), a fresh tensor."""
        seg = torch.einsum(
            "bnih,snh->bnis",
            q + (self.r_s_bias * self.scale)[:, None, :],
            self.seg_embed.to(q.dtype),
        )  # (B, H, Tq, 2): [different, same]
        diff, same = seg[..., :1], seg[..., 1:]
        pos = self.position_scores(q, positions, tk)
        if positions.same_segment is None:
            bias = pos + same
        else:
            bias = pos + diff
            same_seg = positions.same_segment[:, None].to(q.dtype)  # (B, 1, Tq, Tk)
            bias = bias.addcmul_(same_seg, same - diff)
        if positions.cls_first:
            bias[..., 0, :] = 0.0
            bias[..., :, 0] = 0.0
        return bias

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: FunnelPositions | None = None,
    ) -> AttentionOutput:
        check_attention_inputs(x, kv, self.dim, mask)
        if state is not None:
            raise ValueError("FunnelRelativeAttention takes no state; pass state=None")
        if not isinstance(positions, FunnelPositions):
            raise ValueError(
                "FunnelRelativeAttention needs positions=FunnelPositions(...) from the model, "
                f"got {type(positions).__name__}"
            )
        if mask is not None and mask.causal:
            raise ValueError("Funnel attention is bidirectional; mask.causal must be False")
        src = x if kv is None else kv
        b, tq, tk = x.shape[0], x.shape[1], src.shape[1]
        if positions.same_segment is not None and positions.same_segment.shape != (b, tq, tk):
            raise ValueError(
                f"positions.same_segment must be (B={b}, Tq={tq}, Tk={tk}), "
                f"got {tuple(positions.same_segment.shape)}"
            )
        q = self._heads(self.q_proj(x)) * self.scale  # (B, H, Tq, Dh), scaled before the biases
        k = self._heads(self.k_proj(src))  # (B, H, Tk, Dh)
        v = self._heads(self.v_proj(src))  # (B, H, Tk, Dh)
        qu = q + (self.r_w_bias * self.scale)[:, None, :]
        bias = self.score_bias(q, positions, tk)  # (B, H, Tq, Tk)
        key_padding = None if mask is None else mask.key_padding
        p = self.dropout if self.training else 0.0
        if key_padding is not None:
            neg = NEG_INF if x.dtype in (torch.float32, torch.float64) else -1e4
            bias = bias.masked_fill_(~key_padding.to(torch.bool)[:, None, None, :], neg)
        if not (torch.is_grad_enabled() and bias.requires_grad):
            # Inference: the fused kernel takes the float bias as attn_mask.
            o = F.scaled_dot_product_attention(qu, k, v, attn_mask=bias, dropout_p=p, scale=1.0)
        else:
            scores = torch.baddbmm(
                bias.reshape(b * self.n_heads, tq, tk),
                qu.reshape(b * self.n_heads, tq, self.head_dim),
                k.reshape(b * self.n_heads, tk, self.head_dim).transpose(1, 2),
            ).view(b, self.n_heads, tq, tk)  # (B, H, Tq, Tk)
            half = scores.dtype in (torch.float16, torch.bfloat16)
            if half:
                scores = scores.float()
            keep = None
            if p > 0.0:
                keep = torch.empty_like(scores, dtype=torch.bool).bernoulli_(1.0 - p)
            o = _SoftmaxDropoutMatmul.apply(scores, v.to(scores.dtype), p, keep)
            if half:
                o = o.to(x.dtype)
        o = o.transpose(1, 2).reshape(b, tq, self.n_heads * self.head_dim)  # (B, Tq, H*Dh)
        return AttentionOutput(out=self.o_proj(o))
