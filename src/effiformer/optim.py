"""Optimisers the papers used that PyTorch does not ship.

:class:`AdagradParamClip`: Adaptive Attention Span's optimiser (Sukhbaatar et al. 2019, arXiv
1905.07799; official ``adagrad_with_grad_clip.py``, ``--optim adagrad --grad-clip 0.03``). It is
Adagrad in which *each parameter tensor's* step is shrunk when that tensor's gradient is large:
with ``g`` a parameter's gradient and ``c`` the threshold, its learning rate is multiplied by
``min(1, c / (||g||_2 + 1e-10))``. The gradient itself is not changed, so Adagrad's accumulator
still sums the raw ``g ** 2``; there is no global-norm clipping. Selected by
``TrainConfig(optimizer="adagrad-clip", clip=c)`` (the trainer then leaves ``clip`` to the
optimiser instead of clipping the global norm).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["AdagradParamClip"]


class AdagradParamClip(torch.optim.Optimizer):
    """Adagrad (no lr decay, no initial accumulator) with per-parameter step shrinking.

    For every parameter ``p`` with gradient ``g`` (weight decay ``wd`` added to ``g`` first, as
    torch's Adagrad does)::

        sum += g * g
        lr_p = lr * min(1, clip / (||g|| + 1e-10))       # clip <= 0 or None: lr_p = lr
        p -= lr_p * g / (sqrt(sum) + eps)
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        *,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        clip: float | None = None,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if clip is not None and clip < 0:
            raise ValueError(f"clip must be >= 0 or None, got {clip!r}")
        defaults = {"lr": lr, "eps": eps, "weight_decay": weight_decay, "clip": clip}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            clip = group["clip"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    raise RuntimeError("AdagradParamClip does not support sparse gradients")
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float64)
                    state["sum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                state["sum"].addcmul_(g, g)
                lr = group["lr"]
                if clip:
                    norm = float(torch.linalg.vector_norm(g))
                    if norm > clip:
                        lr = lr * clip / (norm + 1e-10)
                p.addcdiv_(g, state["sum"].sqrt().add_(group["eps"]), value=-lr)
        return loss
