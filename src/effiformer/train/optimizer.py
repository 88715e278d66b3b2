"""The optimiser and what happens around its step: parameter groups with and without weight
decay (:func:`make_optimizer`), gradient clipping with auxiliary parameters, and those a module
clips apart, as groups of their own (:func:`clip_gradients`), and the modules' post-step hooks
(:func:`after_optimizer_step`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..optim import AdagradParamClip
from .config import TrainConfig

__all__ = ["ClipNorms", "after_optimizer_step", "clip_gradients", "make_optimizer"]


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


class ClipNorms(NamedTuple):
    """Gradient norms before clipping, one per group (``None``: the model has no such group)."""

    task: float
    aux: float | None = None
    own: float | None = None


def own_clip_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter a submodule asks to have clipped apart (``own_clip_parameters()``, e.g.
    Adaptive Span's span ratios), once each, in module order."""
    out: list[nn.Parameter] = []
    seen: set[int] = set()
    for m in model.modules():
        hook = getattr(m, "own_clip_parameters", None)
        if not callable(hook):
            continue
        for p in hook():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def clip_gradients(model: nn.Module, clip: float) -> ClipNorms:
    """Clip gradients to norm ``clip`` group by group; returns the norms before clipping.

    Parameters the model trains only by auxiliary losses (``model.aux_parameters()``, e.g. the
    Compressive Transformer's compression networks) form a group clipped on its own, as if it had
    its own optimiser: the two gradients never meet in one loss, and one global norm would let an
    auxiliary gradient 1000x larger scale the task gradient down by that factor. Parameters a
    submodule lists in ``own_clip_parameters()`` (Adaptive Span's span ratios, whose gradient
    carries S / R) form a third group, for the same reason. The rest is the task group.
    """
    aux_params = getattr(model, "aux_parameters", None)
    aux = [p for p in aux_params() if p.requires_grad] if callable(aux_params) else []
    aux_ids = {id(p) for p in aux}
    own = [p for p in own_clip_parameters(model) if p.requires_grad and id(p) not in aux_ids]
    apart = aux_ids | {id(p) for p in own}
    task = [p for p in model.parameters() if id(p) not in apart]
    norm = float(torch.nn.utils.clip_grad_norm_(task, clip))
    aux_norm = float(torch.nn.utils.clip_grad_norm_(aux, clip)) if aux else None
    own_norm = float(torch.nn.utils.clip_grad_norm_(own, clip)) if own else None
    return ClipNorms(norm, aux_norm, own_norm)


def after_optimizer_step(model: nn.Module) -> None:
    """Call ``after_optimizer_step()`` on every submodule that defines one, after each optimiser
    step: parameter constraints that are not gradients (Adaptive Span clamps its span
    parameters to [0, 1] after every step, as the paper does)."""
    for m in model.modules():
        hook = getattr(m, "after_optimizer_step", None)
        if callable(hook):
            hook()
