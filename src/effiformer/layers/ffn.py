"""Position-wise feed-forward network (Vaswani et al. 2017, eq. 2).

Activations: ``gelu`` (exact erf form), ``gelu_tanh`` (GPT-2's tanh approximation),
``gelu_sigmoid`` (x * sigmoid(1.702 x), the Sparse Transformer's GELU: Child et al. 2019,
arXiv 1904.10509, section 5.2, after Hendrycks & Gimpel 2016), ``relu``; and the gated
``geglu`` (Shazeer 2020, arXiv 2002.05202: ``(gelu(x W) * (x V)) W2``, the Routing Transformer's
released feed-forward, ``ffn_layer="geglu"``), whose first layer is twice as wide (the two
halves W and V of ``fc1``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FeedForward", "ACTIVATIONS", "GATED_ACTIVATIONS", "gelu_sigmoid"]


def gelu_sigmoid(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_sigmoid": gelu_sigmoid,
    "relu": F.relu,
}

#: gated activations: the name -> the activation of the gate's first half (``geglu_tanh``: the
#: tanh approximation of GELU, as the Routing Transformer's released ``geglu`` computes it)
GATED_ACTIVATIONS = {"geglu": F.gelu, "geglu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class FeedForward(nn.Module):
    """(B, T, D) -> (B, T, D): Linear(D, F) -> activation -> dropout -> Linear(F, D); with a
    gated activation (``geglu``) ``fc1`` is Linear(D, 2F) and the hidden layer is
    ``act(first half) * second half``. ``bias=False``: no biases (the released GEGLU has none)."""

    def __init__(
        self,
        dim: int,
        ffn_dim: int,
        *,
        activation: str = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        known = {**ACTIVATIONS, **GATED_ACTIVATIONS}
        if activation not in known:
            raise ValueError(f"activation must be one of {sorted(known)}, got {activation!r}")
        self.gated = activation in GATED_ACTIVATIONS
        self.fc1 = nn.Linear(dim, 2 * ffn_dim if self.gated else ffn_dim, bias=bias)
        self.fc2 = nn.Linear(ffn_dim, dim, bias=bias)
        self.act = known[activation]
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        if self.gated:
            a, g = h.chunk(2, dim=-1)  # (B, T, F) each
            return self.fc2(self.drop(self.act(a) * g))
        return self.fc2(self.drop(self.act(h)))
