"""The optimiser and what happens around its step: parameter groups with and without weight
decay (:func:`make_optimizer`), gradient clipping with auxiliary parameters as a group of their
own (:func:`clip_gradients`) and the modules' post-step hooks (:func:`after_optimizer_step`)."""

from __future__ import annotations

import torch
from torch import nn

from ..optim import AdagradParamClip
from .config import TrainConfig

__all__ = ["after_optimizer_step", "clip_gradients", "make_optimizer"]


_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)

if hasattr(nn, "RMSNorm"):
    _NORMS = (*_NORMS, nn.RMSNorm)


def _decays(rule: str, module: nn.Module, leaf: str, p: nn.Parameter) -> bool:
    if rule == "1d":
        return p.dim() >= 2
    if leaf == "bias" or isinstance(module, _NORMS):
        return False
    return not (rule == "bias-norm-embedding" and isinstance(module, nn.Embedding))


def make_optimizer(module: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimiser ``config`` names over ``module``'s trainable parameters, in two groups:
    with ``weight_decay`` and without (the parameters the ``config.no_decay`` rule excludes)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for mod in module.modules():  # a tied weight counts once, under its first owner
        for leaf, p in mod.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            (decay if _decays(config.no_decay, mod, leaf, p) else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps)
    if config.optimizer == "adam":
        return torch.optim.Adam(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps)
    if config.optimizer == "adagrad-clip":
        return AdagradParamClip(groups, lr=config.lr, eps=config.eps, clip=config.clip)
    if config.optimizer == "adafactor":  # its own eps pair (None, 1e-3); no betas, no momentum
        return torch.optim.Adafactor(groups, lr=config.lr)
    return torch.optim.Adagrad(groups, lr=config.lr, eps=config.eps)


def clip_gradients(model: nn.Module, clip: float) -> tuple[float, float | None]:
    """Clip gradients to global norm ``clip``; returns (norm, aux norm) before clipping.

    Parameters the model trains only by auxiliary losses (``model.aux_parameters()``, e.g. the
    Compressive Transformer's compression networks) form a group clipped on its own, as if it had
    its own optimiser: the two gradients never meet in one loss, and one global norm would let an
    auxiliary gradient 1000x larger scale the task gradient down by that factor. The aux norm is
    ``None`` for models without such parameters.
    """
    aux_params = getattr(model, "aux_parameters", None)
    aux = [p for p in aux_params() if p.requires_grad] if callable(aux_params) else []
    ids = {id(p) for p in aux}
    main = [p for p in model.parameters() if id(p) not in ids]
    norm = float(torch.nn.utils.clip_grad_norm_(main, clip))
    if not aux:
        return norm, None
    return norm, float(torch.nn.utils.clip_grad_norm_(aux, clip))


def after_optimizer_step(model: nn.Module) -> None:
    """Call ``after_optimizer_step()`` on every submodule that defines one, after each optimiser
    step: parameter constraints that are not gradients (Adaptive Span clamps its span
    parameters to [0, 1] after every step, as the paper does)."""
    for m in model.modules():
        hook = getattr(m, "after_optimizer_step", None)
        if callable(hook):
            hook()
