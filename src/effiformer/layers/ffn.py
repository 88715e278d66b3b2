"""Position-wise feed-forward network (Vaswani et al. 2017, eq. 2).

Activations: ``gelu`` (exact erf form), ``gelu_tanh`` (GPT-2's tanh approximation),
``gelu_sigmoid`` (x * sigmoid(1.702 x), the Sparse Transformer's GELU: Child et al. 2019,
arXiv 1904.10509, section 5.2, after Hendrycks & Gimpel 2016), ``relu``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FeedForward", "ACTIVATIONS", "gelu_sigmoid"]


def gelu_sigmoid(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_sigmoid": gelu_sigmoid,
    "relu": F.relu,
}


class FeedForward(nn.Module):
    """(B, T, D) -> (B, T, D): Linear(D, F) -> activation -> dropout -> Linear(F, D)."""

    def __init__(self, dim: int, ffn_dim: int, *, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.act = ACTIVATIONS[activation]
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))
