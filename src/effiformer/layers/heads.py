"""Task heads shared by encoder families (Funnel, and any bidirectional encoder).

Each head maps hidden states (B, T, D) to task logits; the losses are plain functions so a model
class composes ``encoder -> head -> loss`` in a few readable lines.

- :class:`MaskedLMHead`: dense -> activation -> LayerNorm, then the (tied) embedding matrix plus
  a bias (BERT, Devlin et al. 2018, arXiv 1810.04805, and the official Funnel TF ``lm_loss``).
  ``transform=False`` drops the dense/LN transform (HF transformers' ``FunnelForMaskedLM``).
- :class:`SequenceClassificationHead`: hidden[:, 0] -> dense -> tanh -> dropout -> linear
  (Funnel sec. 4, GLUE); one output means regression (STS-B) with an MSE loss.
- :class:`TokenClassificationHead`: dropout -> linear per token.
- :class:`SpanHead`: linear to start/end logits per token (extractive QA, SQuAD).
- :class:`ReplacedTokenHead`: dense -> activation -> linear(1), ELECTRA's discriminator
  (Clark et al. 2020, arXiv 2003.10555).
Multiple choice uses :class:`SequenceClassificationHead` with one output per choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ffn import ACTIVATIONS

__all__ = [
    "IGNORE_INDEX",
    "MaskedLMHead",
    "SequenceClassificationHead",
    "TokenClassificationHead",
    "SpanHead",
    "ReplacedTokenHead",
    "sequence_classification_loss",
    "token_classification_loss",
    "span_loss",
    "replaced_token_loss",
]

IGNORE_INDEX = -100


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class MaskedLMHead(nn.Module):
    """(B, T, D) -> (B, T, V). Tie with ``head.decoder.weight = embedding.weight``."""

    def __init__(
        self,
        dim: int,
        vocab_size: int,
        *,
        embed_dim: int | None = None,
        transform: bool = True,
        activation: str = "gelu_tanh",
        norm_eps: float = 1e-12,
    ) -> None:
        super().__init__()
        embed_dim = dim if embed_dim is None else embed_dim
        if not transform and embed_dim != dim:
            raise ValueError("transform=False needs embed_dim == dim (no projection to the table)")
        self.transform = transform
        if transform:
            self.dense = nn.Linear(dim, embed_dim)
            self.act = _activation(activation)
            self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.decoder = nn.Linear(embed_dim, vocab_size)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        if self.transform:
            hidden = self.norm(self.act(self.dense(hidden)))
        return self.decoder(hidden)


class SequenceClassificationHead(nn.Module):
    """(B, T, D) -> (B, n_labels) from the first ([CLS]) position: dense, tanh, dropout, linear."""

    def __init__(self, dim: int, n_labels: int, *, dropout: float = 0.1) -> None:
        super().__init__()
        if n_labels < 1:
            raise ValueError(f"n_labels must be >= 1, got {n_labels}")
        self.dense = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(dim, n_labels)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.out(self.drop(torch.tanh(self.dense(hidden[:, 0]))))


class TokenClassificationHead(nn.Module):
    """(B, T, D) -> (B, T, n_labels)."""

    def __init__(self, dim: int, n_labels: int, *, dropout: float = 0.1) -> None:
        super().__init__()
        if n_labels < 1:
            raise ValueError(f"n_labels must be >= 1, got {n_labels}")
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(dim, n_labels)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.out(self.drop(hidden))


class SpanHead(nn.Module):
    """(B, T, D) -> start logits (B, T), end logits (B, T)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.out = nn.Linear(dim, 2)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.out(hidden).unbind(dim=-1)
        return start, end


class ReplacedTokenHead(nn.Module):
    """(B, T, D) -> (B, T) logits that each token was replaced (ELECTRA discriminator)."""

    def __init__(self, dim: int, *, activation: str = "gelu_tanh") -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.act = _activation(activation)
        self.out = nn.Linear(dim, 1)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.out(self.act(self.dense(hidden))).squeeze(-1)


def sequence_classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy for (B, C) logits and (B,) int labels; MSE when C == 1 (regression)."""
    if labels.shape[0] != logits.shape[0]:
        raise ValueError(
            f"labels must have batch size {logits.shape[0]}, got {tuple(labels.shape)}"
        )
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.reshape(-1).float())
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"classification labels must be integers, got {labels.dtype}")
    return F.cross_entropy(logits.float(), labels.reshape(-1).long())


def token_classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy over tokens for (B, T, C) logits and (B, T) labels, ignoring -100."""
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels must be {tuple(logits.shape[:2])}, got {tuple(labels.shape)}")
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )


def span_loss(start: Tensor, end: Tensor, start_pos: Tensor, end_pos: Tensor) -> Tensor:
    """Mean of start and end cross-entropies; positions outside [0, T) are ignored."""
    t = start.shape[1]
    losses = []
    for logits, pos in ((start, start_pos), (end, end_pos)):
        pos = pos.reshape(-1).long()
        if pos.shape[0] != logits.shape[0]:
            raise ValueError(
                f"span positions must be (B={logits.shape[0]},), got {tuple(pos.shape)}"
            )
        pos = torch.where((pos >= 0) & (pos < t), pos, torch.full_like(pos, IGNORE_INDEX))
        losses.append(F.cross_entropy(logits.float(), pos, ignore_index=IGNORE_INDEX))
    return (losses[0] + losses[1]) / 2


def replaced_token_loss(logits: Tensor, replaced: Tensor, keep: Tensor | None = None) -> Tensor:
    """Mean binary cross-entropy of (B, T) logits against (B, T) replaced flags over real tokens."""
    target = replaced.to(logits.dtype)
    if keep is None:
        return F.binary_cross_entropy_with_logits(logits.float(), target.float())
    keep = keep.to(torch.bool)
    return F.binary_cross_entropy_with_logits(logits[keep].float(), target[keep].float())
