"""Lightweight and dynamic depthwise convolutions: the convolution branch of Lite Transformer.

Wu, Fan, Baevski, Dauphin and Auli, "Pay Less Attention with Lightweight and Dynamic
Convolutions", ICLR 2019 (arXiv 1901.10430), sec. 3:

- eq. 2 (weight normalisation): a kernel of ``K`` taps is softmax-normalised over the taps;
- eq. 3 (LightConv): a depthwise convolution whose ``H`` kernels are each shared by ``C / H``
  consecutive channels (channel ``c`` uses kernel ``c // (C / H)``, fairseq's TBC layout);
- eq. 4 (DynamicConv): the kernel of position ``i`` is a linear function of ``X_i``
  (``f(X_i) = W^Q X_i``, ``H * K`` outputs, no bias), one kernel per position and group;
- sec. 3 / fig. 2b: the block is ``Linear(C -> C)`` (``-> 2C`` followed by a GLU when ``glu``),
  the convolution, ``Linear(C -> C)``; DropConnect (dropout on the normalised kernel) in training.

:func:`depthwise_conv` computes, for ``x`` (B, T, C) and a kernel ``w`` of ``K`` taps,
``out[b, t, c] = sum_k w[h(c), k] * x[b, t + k - P, c]`` with zeros outside ``[0, T)``;
``P`` is the left padding: ``K - 1`` for a causal (decoder) convolution, ``(K - 1) // 2`` for a
centred (encoder) one. Three forms compute it (``method``):

- ``"band"``: the kernel as a band matrix multiplied with the input (fairseq's
  ``_forward_expanded``). fairseq builds one T x T band per sentence and head, so it switches to
  the unfold form above 512 tokens to save memory; here the band is cut into blocks of
  ``block`` rows (each block a ``block x (block + K - 1)`` matrix over its window of the input),
  so memory is linear in ``T`` and the one form serves every length; sequences no longer than
  ``block`` are one block, i.e. fairseq's T x T band. The band is made with the
  pad-and-reshape "skew" (row ``i`` shifted right by ``i``), differentiable without a scatter.
- ``"unfold"``: windows of ``K`` inputs per position multiplied with the kernel (fairseq's
  ``_forward_unfolded``); what incremental decoding uses (one or a few positions a step) and the
  reference the tests check the others against.
- ``"conv1d"``: ``torch.nn.functional.conv1d`` with ``groups=C`` (the kernel repeated over each
  group's channels); lightweight kernels only (one kernel for every position).

``"auto"`` takes ``conv1d`` for a lightweight kernel of at most 15 taps on sequences of 128
tokens or more, and ``band`` otherwise: what was fastest (forward + backward, one thread) on the
project's CPU over T in {30, 256, 1024} and K in {3, 7, 15, 31}; the band's cost grows with
``block + K - 1`` per output, conv1d's with ``K`` but with a larger cost per tap and per row.
When the kernel reaches further than the sequence (``K > T``) the taps that can only meet
padding are dropped before any form runs: a causal kernel keeps its last ``T`` taps, as fairseq
does.

Deliberate differences from fairseq's code (documented where they matter):

- DropConnect of a *lightweight* kernel drops entries of the (H, K) kernel itself, one mask
  per forward shared by every position: fairseq's CUDA ``LightconvLayer`` (what the paper's
  models were trained with) does this; its CPU fallback drops per position.
- fairseq's dynamic unfold path re-normalises a causal kernel over the taps it keeps when
  ``K > T``; its band path (used below 512 tokens, so in every released configuration) and its
  incremental decoding do not. Here the kernel is always normalised over all ``K`` taps, so a
  sequence computes the same outputs at every length and in decoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops.tracing import tracing
from .base import keep_init

__all__ = [
    "BAND_BLOCK",
    "CONV_METHODS",
    "ConvBranch",
    "conv_padded",
    "conv_padding",
    "depthwise_conv",
]

#: Forms of :func:`depthwise_conv`.
CONV_METHODS = ("auto", "band", "unfold", "conv1d")
#: Rows per block of the band form (sequences up to this length are one T x T band).
BAND_BLOCK = 32


def conv_padding(kernel_size: int, causal: bool) -> int:
    """Left padding ``P``: ``K - 1`` (causal: position ``t`` sees ``t - K + 1 .. t``) or
    ``(K - 1) // 2`` (centred; for odd ``K`` that is ``K // 2`` on both sides)."""
    return kernel_size - 1 if causal else (kernel_size - 1) // 2


def _check(x: Tensor, weight: Tensor, padding_l: int) -> tuple[int, int]:
    if x.dim() != 3:
        raise ValueError(f"x must be (B, T, C), got {tuple(x.shape)}")
    b, t, c = x.shape
    if weight.dim() == 2:
        h, k = weight.shape
    elif weight.dim() == 4:
        if weight.shape[:2] != (b, t):
            raise ValueError(
                f"a dynamic kernel must be (B={b}, T={t}, H, K), got {tuple(weight.shape)}"
            )
        h, k = weight.shape[2:]
    else:
        raise ValueError(f"weight must be (H, K) or (B, T, H, K), got {tuple(weight.shape)}")
    if h < 1 or c % h:
        raise ValueError(f"the {c} channels of x must split into the kernel's H={h} groups")
    if not 0 <= padding_l < k:
        raise ValueError(f"padding_l must be in [0, K-1={k - 1}], got {padding_l}")
    return h, k


def depthwise_conv(
    x: Tensor,
    weight: Tensor,
    *,
    padding_l: int,
    method: str = "auto",
    block: int = BAND_BLOCK,
) -> Tensor:
    """Depthwise convolution of ``x`` (B, T, C) with ``H`` kernel groups -> (B, T, C).

    ``weight``: (H, K), one kernel per group (lightweight), or (B, T, H, K), one per position and
    group (dynamic); already normalised / dropped as the caller wants. ``padding_l``: the left
    padding ``P`` (see :func:`conv_padding`); the right padding is ``K - 1 - P``. ``method``: one
    of :data:`CONV_METHODS` (module docstring); ``block``: rows per block of the band form."""
    if method not in CONV_METHODS:
        raise ValueError(f"method must be one of {list(CONV_METHODS)}, got {method!r}")
    h, k = _check(x, weight, padding_l)
    t = x.shape[1]
    shared = weight.dim() == 2
    if method == "conv1d" and not shared:
        raise ValueError("method='conv1d' needs one (H, K) kernel for every position")
    traced = tracing()  # T may be symbolic: no branch on it (one graph for every length)
    # Taps that only ever meet padding: offset k - P outside [-(T-1), T-1] (dropping them is a
    # shortcut; kept while tracing they multiply zeros).
    lo, hi = (0, k) if traced else (max(0, padding_l - (t - 1)), min(k, padding_l + t))
    if lo > 0 or hi < k:
        weight = weight[..., lo:hi]
        padding_l, k = padding_l - lo, hi - lo
    xp = F.pad(x, (0, 0, padding_l, k - 1 - padding_l))  # (B, T + K - 1, C)
    if method == "auto" and traced:
        method = "conv1d" if shared and k <= 15 else "unfold"
    elif method == "auto":
        method = "conv1d" if shared and t >= 128 and k <= 15 else "band"
    return conv_padded(xp, weight, method=method, block=block)


def conv_padded(xp: Tensor, weight: Tensor, *, method: str = "unfold", block: int = BAND_BLOCK):
    """The convolution over an input already padded (or preceded by its decoding buffer):
    ``xp`` (B, T + K - 1, C) -> (B, T, C), ``out[t] = sum_k w[t, k] * xp[t + k]``."""
    k = weight.shape[-1]
    b, tp, c = xp.shape
    t = tp - k + 1
    h = weight.shape[-2]
    r = c // h
    if t < 1:
        raise ValueError(f"a padded input of {tp} positions is too short for K={k} taps")
    if method == "unfold":
        xu = xp.unfold(1, k, 1).reshape(b, t, h, r, k)  # (B, T, H, R, K) windows
        w = weight.unsqueeze(-1)  # (H, K, 1) or (B, T, H, K, 1)
        return torch.matmul(xu, w).reshape(b, t, c)
    if method == "conv1d":
        w = weight.repeat_interleave(r, dim=0).unsqueeze(1)  # (C, 1, K)
        return F.conv1d(xp.transpose(1, 2), w, groups=c).transpose(1, 2)  # (B, T, C)
    if method == "band":
        return _band(xp, weight, t, max(1, min(block, t)))
    raise ValueError(f"method must be 'band', 'unfold' or 'conv1d', got {method!r}")


def _skew(w: Tensor, blk: int) -> Tensor:
    """(..., blk, K) kernels -> (..., blk, blk + K - 1) band: row ``i`` holds its kernel at columns
    ``i .. i + K - 1`` (pad each row by ``blk`` zeros, flatten, re-cut rows one shorter)."""
    k = w.shape[-1]
    lead = w.shape[:-2]
    flat = F.pad(w, (0, blk)).reshape(*lead, blk * (blk + k))
    return flat[..., : blk * (blk + k - 1)].reshape(*lead, blk, blk + k - 1)


def _band(xp: Tensor, weight: Tensor, t: int, blk: int) -> Tensor:
    b, _, c = xp.shape
    h, k = weight.shape[-2:]
    r = c // h
    nb = -(-t // blk)
    width = blk + k - 1
    extra = nb * blk - t
    xw = F.pad(xp, (0, 0, 0, extra)).view(b, nb * blk + k - 1, h, r).permute(0, 2, 1, 3)
    xw = xw.unfold(2, width, blk).transpose(-1, -2)  # (B, H, nb, W, R): block windows
    if weight.dim() == 2:
        band = _skew(weight[:, None, :].expand(h, blk, k), blk)  # (H, blk, W), one per group
        out = torch.matmul(band[None, :, None], xw)  # (B, H, nb, blk, R)
    else:
        wt = weight.permute(0, 2, 1, 3)  # (B, H, T, K)
        wt = F.pad(wt, (0, 0, 0, extra)).reshape(b, h, nb, blk, k)
        out = torch.matmul(_skew(wt, blk), xw)  # (B, H, nb, blk, R)
    out = out.reshape(b, h, nb * blk, r)[:, :, :t]  # (B, H, T, R)
    return out.permute(0, 2, 1, 3).reshape(b, t, c)


class ConvBranch(nn.Module):
    """The convolution block of fig. 2b, channels ``dim`` -> ``dim``.

    ``Linear(dim -> dim)`` (``-> 2 dim`` then GLU with ``glu``), padded positions zeroed, the
    depthwise convolution (``heads`` kernel groups of ``kernel_size`` taps; lightweight: a
    learned (H, K) kernel; ``dynamic``: a bias-free ``Linear(dim -> H * K)`` of the post-GLU
    input gives each position its kernels), softmax over the taps (``weight_softmax``),
    DropConnect (``weight_dropout``) in training, ``Linear(dim -> dim)``.

    Init as fairseq: Xavier-uniform linears with zero biases (the models' init loops do the
    same), Xavier-uniform (H, K) lightweight kernel (kept by :func:`keep_init`).
    """

    def __init__(
        self,
        dim: int,
        *,
        kernel_size: int,
        heads: int,
        dynamic: bool = False,
        glu: bool = False,
        weight_softmax: bool = True,
        weight_dropout: float = 0.0,
        method: str = "auto",
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"conv width {dim} must be divisible by its {heads} kernel groups")
        if method not in CONV_METHODS:
            raise ValueError(f"method must be one of {list(CONV_METHODS)}, got {method!r}")
        if dynamic and method == "conv1d":
            raise ValueError("method='conv1d' computes lightweight (shared) kernels only")
        self.dim, self.kernel_size, self.heads = dim, kernel_size, heads
        self.dynamic, self.glu = dynamic, glu
        self.weight_softmax, self.weight_dropout, self.method = (
            weight_softmax,
            weight_dropout,
            method,
        )
        self.linear1 = nn.Linear(dim, 2 * dim if glu else dim)
        self.linear2 = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)
        nn.init.zeros_(self.linear1.bias)
        nn.init.zeros_(self.linear2.bias)
        if dynamic:
            self.weight_linear = nn.Linear(dim, heads * kernel_size, bias=False)
            nn.init.xavier_uniform_(self.weight_linear.weight)
            self.weight = None
        else:
            self.weight_linear = None
            self.weight = keep_init(nn.Parameter(torch.empty(heads, kernel_size)))
            nn.init.xavier_uniform_(self.weight)

    def conv_input(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        """(B, T, dim) -> what the convolution sees: the input linear (and GLU), with positions
        where ``keep`` (B, T) is False set to zero."""
        u = self.linear1(x)
        if self.glu:
            u = F.glu(u, dim=-1)  # first half * sigmoid(second half), as nn.GLU()
        if keep is not None:
            u = u.masked_fill(~keep[..., None], 0.0)
        return u

    def kernel(self, u: Tensor) -> Tensor:
        """Normalised kernels before DropConnect: (H, K) (lightweight) or (B, T, H, K) (dynamic,
        from the conv input ``u`` (B, T, dim))."""
        if self.dynamic:
            w = self.weight_linear(u).view(u.shape[0], u.shape[1], self.heads, self.kernel_size)
        else:
            w = self.weight
        return torch.softmax(w, dim=-1) if self.weight_softmax else w

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool,
        keep: Tensor | None = None,
        buffer: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, dim) -> (out (B, T, dim), the next decoding buffer or None).

        ``keep``: (B, T) bool, False on padded positions (zeroed before the convolution).
        ``buffer``: (B, K - 1, dim) the convolution inputs of the ``K - 1`` positions before
        ``x`` (causal decoding; zeros before the first token); the last ``K - 1`` of
        ``buffer ++ input`` come back as the next buffer."""
        u = self.conv_input(x, keep)
        w = F.dropout(self.kernel(u), self.weight_dropout, training=self.training)
        new_buffer = None
        if buffer is not None:
            if not causal:
                raise ValueError("a decoding buffer needs a causal convolution")
            k = self.kernel_size
            if buffer.shape != (u.shape[0], k - 1, self.dim):
                raise ValueError(
                    f"the convolution buffer must be (B={u.shape[0]}, K-1={k - 1}, {self.dim}), "
                    f"got {tuple(buffer.shape)}"
                )
            xp = torch.cat([buffer.to(u.dtype), u], dim=1)  # (B, K - 1 + T, dim)
            y = conv_padded(xp, w, method="unfold")
            new_buffer = xp[:, xp.shape[1] - (k - 1) :]
        else:
            y = depthwise_conv(
                u, w, padding_l=conv_padding(self.kernel_size, causal), method=self.method
            )
        return self.linear2(y), new_buffer

    def extra_repr(self) -> str:
        kind = "dynamic" if self.dynamic else "lightweight"
        return (
            f"{self.dim}, {kind}, kernel_size={self.kernel_size}, heads={self.heads}, "
            f"glu={self.glu}, weight_dropout={self.weight_dropout}, method={self.method!r}"
        )
