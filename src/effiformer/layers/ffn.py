"""Position-wise feed-forward network (Vaswani et al. 2017, eq. 2)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FeedForward", "ACTIVATIONS"]

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
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
