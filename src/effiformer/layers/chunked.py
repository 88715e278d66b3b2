"""Chunked feed-forward and chunked output loss (Reformer, Kitaev et al. 2020, arXiv 2001.04451,
sec. 3 "Chunking"; trax ``tl.Chunk`` around the feed-forward block and the loss).

Position-wise layers can run over slices of the sequence: the FFN's (B, T, d_ff) intermediate and
the (B, T, vocab) logits then only ever exist for one chunk. In training each chunk is
recomputed in the backward pass (``torch.utils.checkpoint``, RNG state preserved), so only the
chunk inputs are kept for the backward. The result equals the unchunked computation: bit for bit
for the feed-forward without dropout (each row's arithmetic is the same: no chunk is shorter than
``chunk_len``, see :func:`chunk_slices`; checked on this CPU's MKL by the tests), to rounding for
the loss (a sum over chunks). With dropout each chunk draws its own mask (as trax's chunked FFN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .heads import IGNORE_INDEX

__all__ = ["ChunkedFeedForward", "chunk_slices", "chunked_lm_loss"]


def chunk_slices(length: int, chunk: int | None) -> list[slice]:
    """Slices of ``length`` positions in chunks of ``chunk`` (``None``: one slice); the last
    chunk absorbs the remainder, so none is shorter than ``chunk``: matrix-multiply libraries
    (MKL) take another code path for a handful of rows, whose results differ in the last bit."""
    if chunk is None or chunk >= length:
        return [slice(0, length)]
    n = length // chunk
    out = [slice(i * chunk, (i + 1) * chunk) for i in range(n)]
    out[-1] = slice(out[-1].start, length)
    return out


class ChunkedFeedForward(nn.Module):
    """Runs ``ffn`` (any position-wise module, (B, T, D) -> (B, T, D)) over sequence chunks of
    ``chunk_len``; ``recompute``: checkpoint every chunk when gradients are needed (only chunk
    inputs are kept for the backward). The wrapped module is ``self.ffn`` (checkpoint keys
    ``...ffn.ffn.fc1.weight``)."""

    def __init__(self, ffn: nn.Module, chunk_len: int, *, recompute: bool = True) -> None:
        super().__init__()
        if isinstance(chunk_len, bool) or not isinstance(chunk_len, int) or chunk_len < 1:
            raise ValueError(f"chunk_len must be a positive integer, got {chunk_len!r}")
        self.ffn, self.chunk_len, self.recompute = ffn, chunk_len, recompute

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3:
            raise ValueError(f"ChunkedFeedForward expects (B, T, D), got {tuple(x.shape)}")
        grad = torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in self.ffn.parameters())
        )
        outs = []
        for s in chunk_slices(x.shape[1], self.chunk_len):
            piece = x[:, s]  # (B, c, D)
            if self.recompute and grad:
                outs.append(checkpoint(self.ffn, piece, use_reentrant=False))
            else:
                outs.append(self.ffn(piece))
        return torch.cat(outs, dim=1)


def _chunk_nll(head: Callable[[Tensor], Tensor], h: Tensor, y: Tensor) -> Tensor:
    logits = head(h)  # (B, c, V)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        y.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def chunked_lm_loss(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    targets: Tensor,
    chunk_len: int | None,
) -> Tensor:
    """Mean cross-entropy (nats) of ``head(hidden)`` against ``targets`` (B, T), ignoring -100,
    computed ``chunk_len`` positions at a time; in training each chunk's logits are recomputed
    in the backward pass, so (B, T, V) logits never exist. hidden (B, T, D)."""
    if hidden.shape[:2] != targets.shape:
        raise ValueError(
            f"targets must be (B, T) = {tuple(hidden.shape[:2])}, got {tuple(targets.shape)}"
        )
    count = (targets != IGNORE_INDEX).sum()
    grad = torch.is_grad_enabled()
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in chunk_slices(hidden.shape[1], chunk_len):
        h, y = hidden[:, s], targets[:, s]
        if grad and len(range(*s.indices(hidden.shape[1]))) < hidden.shape[1]:
            total = total + checkpoint(_chunk_nll, head, h, y, use_reentrant=False)
        else:
            total = total + _chunk_nll(head, h, y)
    return total / count.clamp_min(1)
