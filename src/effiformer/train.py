"""``train(model, task, config) -> history``: one resumable training loop for every model and task.

* Optimiser (``optimizer``): AdamW (Loshchilov & Hutter 2019, arXiv 1711.05101), Adam or Adagrad,
  with ``lr``, ``betas``, ``eps`` and ``weight_decay``; which parameters decay is ``no_decay``
  (:data:`effiformer.recipes.NO_DECAY_RULES`; default ``"1d"``: matrices only, ``p.dim() >= 2``).
* Schedule (``schedule``): linear warmup over ``warmup`` steps, then cosine (Loshchilov & Hutter
  2017, arXiv 1608.03983, one cycle, no restarts) or linear decay to ``min_lr_ratio`` of the peak,
  a constant, or fairseq's inverse square root; a ``LambdaLR`` factor, see :func:`lr_factor`.
  Each family's paper recipe (:mod:`effiformer.recipes`) fills these fields in ``effiformer
  train``; :class:`TrainConfig`'s own defaults are the project's GPT-2-style default.
* Step: the global batch of ``task.batch_size`` rows is split across DDP ranks, then into
  ``grad_accum`` micro-batches (``Batch.split``); each micro-batch differentiates
  ``out.total_loss / grad_accum`` (task loss plus aux losses), so accumulation changes memory use,
  not the result. Batches with row weights (``Batch.weights``: translation's target tokens per
  row) weigh each micro-batch of each rank by its share of the global batch's weight instead
  (:func:`_micro_scales`), which keeps a per-token mean loss exact under accumulation and DDP. Then gradient clipping (global norm; parameters trained only by an aux loss,
  ``model.aux_parameters()``, are clipped as a group of their own, :func:`clip_gradients`), the
  optimiser and scheduler steps, and ``model.apply_updates(out.updates)`` (no-grad buffer
  updates, averaged over micro-batches and ranks; a deliberate simplification for online k-means
  under data parallelism).
* Recurrent state (``model.init_state(rows)`` is not ``None``): carried across steps per
  micro-batch slot, detached, restarted when the task starts new streams.
* bf16 autocast: on by default on CUDA devices with bf16, off on CPU (``bf16=True`` forces it).
* DDP under ``torchrun``: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment make
  :func:`train` join (or create) the process group (gloo on CPU, nccl on CUDA) and wrap the model
  in ``DistributedDataParallel``; every rank takes an equal share of rows of the same global
  batch and the reported loss is the all-reduced mean over the global batch, so N processes
  follow the loss curve of one process with the same global batch. Only rank 0 evaluates and
  writes files or progress.
* Time budget (``time_budget``): the run stops when it is spent; without ``steps`` the schedule
  is sized from the measured step time (see :class:`TrainConfig`). Under DDP the ranks share one
  clock (the slowest rank's, all-reduced), so they stop at the same step with the same schedule.
* Stop requests (``train(..., stop=...)``, Ctrl-C in the CLI): the step finishes, a checkpoint
  is written, ``stop_reason`` is ``"interrupted"``. A non-finite loss or gradient norm raises
  ``FloatingPointError`` naming the last checkpoint; weights that became non-finite are never
  saved.
* Evaluation every ``eval_every`` steps and at the end, under a forked RNG so it never changes
  the training trajectory. Records go to ``OUT/metrics.jsonl``: ``{"step", "loss", "lr",
  "tokens_per_s", "step_s"}`` per training step (``"loss_weight"``: the step's summed
  :attr:`~effiformer.tasks.Batch.weights`, for weighted tasks) and ``{"step", "val_bpc" |
  "val_ppl", "val_loss", "val_tokens"}`` per evaluation; a time budget adds what it
  decided (``{"step", "total_steps", "warmup", "step_s", "budget_s"}``).

Checkpoints (every ``checkpoint_every`` steps and at the end) are run checkpoints
(:func:`effiformer.checkpoint.save_run_checkpoint`: atomic, with a ``latest`` pointer and
``meta.json`` hashes); ``trainer.pt`` holds the optimiser, the scheduler, the RNG states of every
rank (python, numpy, torch CPU and CUDA), the data position, the step and the recurrent state.
Resuming from one on CPU reproduces the uninterrupted run's losses bitwise (tested; a resume with
another number of processes or another ``grad_accum`` is allowed but restarts RNG / recurrent
state, with a warning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from .checkpoint import (
    LATEST,
    CheckpointError,
    atomic_write_bytes,
    read_trainer_state,
    resolve_checkpoint,
    save_run_checkpoint,
)
from .config import ConfigError
from .optim import AdagradParamClip
from .recipes import NO_DECAY_RULES, OPTIMIZERS, SCHEDULES

__all__ = [
    "METRICS",
    "TrainConfig",
    "TrainHistory",
    "train",
    "lr_factor",
    "clip_gradients",
    "after_optimizer_step",
    "make_optimizer",
]

logger = logging.getLogger(__name__)

METRICS = "metrics.jsonl"


# ------------------------------------------------------------------------------------------------
# Configuration and schedule
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train (the data, batch size and sequence length belong to the task).

    ``steps``: optimiser steps in all (the schedule's length; on resume, the total including the
    steps already done). ``time_budget``: stop after this many seconds of this call, whichever
    of the two comes first; ``time_budget_counts_eval=False`` leaves evaluations and checkpoints
    out of those seconds. ``steps=None`` with a ``time_budget`` sizes the schedule from the
    budget: the first steps are timed and the schedule's length set to the steps that fit
    (re-estimated at 25/50/75% of the budget), with ``warmup`` capped at ``planned_warmup_cap``
    of it (None: not capped), so decay ends with the budget (see :func:`train`); on resume
    without a budget, ``steps=None`` continues to the length planned before. ``optimizer``: one of :data:`~effiformer.recipes.OPTIMIZERS`;
    ``betas`` (Adam/AdamW) and ``eps``; ``weight_decay`` on every parameter but those the
    ``no_decay`` rule excludes (:data:`~effiformer.recipes.NO_DECAY_RULES`). ``schedule``: one of
    :data:`~effiformer.recipes.SCHEDULES` after ``warmup`` linear warmup steps, decaying to
    ``min_lr_ratio`` of ``lr`` (cosine, linear). ``clip``: max global gradient norm (None: no
    clipping; with ``optimizer="adagrad-clip"`` the per-parameter threshold that the optimiser
    applies instead, :class:`~effiformer.optim.AdagradParamClip`). The defaults are the project's GPT-2-style default (AdamW, betas (0.9, 0.99), weight
    decay 0.1 on matrices, cosine to 0.1 of the peak, clip 1.0); ``effiformer train`` fills these
    fields from the family's recipe (:mod:`effiformer.recipes`).
    ``bf16``: autocast to bfloat16 (None: on for CUDA with bf16, off on CPU). ``eval_every`` /
    ``checkpoint_every``: None means only at the end. ``out_dir``: where checkpoints and
    ``metrics.jsonl`` go (None: no files). ``resume``: a run directory (with ``latest``) or one
    checkpoint directory to continue from. ``keep_checkpoints``: how many of the newest
    checkpoints to keep (None: all). ``model_name``, ``task`` and ``task_options`` are recorded
    in checkpoints (the registered model and task names and the options the task was built
    from, so that ``effiformer train --resume`` and ``effiformer eval`` can rebuild it); the
    loop does not read them. ``compile``: a ``torch.compile`` backend (``"inductor"``, or
    ``"aot_eager"`` to trace without generating code) the training forward and backward run
    under (None: eager); evaluation, checkpoints and the weights stay the plain module's.
    """

    steps: int | None = 1000
    optimizer: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 0.1
    no_decay: str = "1d"
    warmup: int = 100
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_accum: int = 1
    clip: float | None = 1.0
    seed: int = 0
    device: str = "auto"
    bf16: bool | None = None
    time_budget: float | None = None
    time_budget_counts_eval: bool = True
    planned_warmup_cap: float | None = 0.1
    eval_every: int | None = 200
    eval_split: str = "valid"
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = 1
    out_dir: str | None = None
    resume: str | None = None
    log_every: int = 1
    progress: bool = True
    model_name: str | None = None
    task: str | None = None
    task_options: dict[str, Any] | None = None
    find_unused_parameters: bool = False
    compile: str | None = None

    def __post_init__(self) -> None:
        for name in ("grad_accum", "log_every"):
            _check_int(name, getattr(self, name), 1)
        if self.compile is not None and (not isinstance(self.compile, str) or not self.compile):
            raise ConfigError(
                f"compile must be a torch.compile backend name (e.g. 'inductor') or None, got "
                f"{self.compile!r}"
            )
        if self.steps is not None:
            _check_int("steps", self.steps, 1)
        elif self.time_budget is None and self.resume is None:
            raise ConfigError(
                "steps=None sizes the schedule from time_budget; give steps or a time_budget"
            )
        if self.planned_warmup_cap is not None and not 0.0 < self.planned_warmup_cap <= 1.0:
            raise ConfigError(
                f"planned_warmup_cap must be in (0, 1] or None, got {self.planned_warmup_cap!r}"
            )
        _check_int("warmup", self.warmup, 0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")
        for name in ("eval_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if not (isinstance(self.lr, int | float) and self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a positive number, got {self.lr!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (isinstance(self.eps, int | float) and self.eps > 0):
            raise ConfigError(f"eps must be a positive number, got {self.eps!r}")
        for name, choices in (
            ("optimizer", OPTIMIZERS),
            ("schedule", SCHEDULES),
            ("no_decay", tuple(NO_DECAY_RULES)),
        ):
            if getattr(self, name) not in choices:
                raise ConfigError(
                    f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}"
                )
        if self.clip is not None and not self.clip > 0:
            raise ConfigError(f"clip must be a positive number or None, got {self.clip!r}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ConfigError(
                f"time_budget must be a positive number of seconds or None, got {self.time_budget!r}"
            )
        if self.eval_split not in ("train", "valid", "test"):
            raise ConfigError(
                f"eval_split must be 'train', 'valid' or 'test', got {self.eval_split!r}"
            )
        if not (self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps")):
            raise ConfigError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


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


def lr_factor(
    step: int, *, warmup: int, total: int, min_lr_ratio: float, schedule: str = "cosine"
) -> float:
    """Multiplier of the peak lr for optimiser step ``step + 1`` (``step`` steps done).

    Warmup: ``(step + 1) / warmup`` for ``step < warmup`` (the ``warmup``-th step reaches the
    peak). Then, with ``p = (step - warmup) / (total - warmup)`` clipped to [0, 1] and
    ``r = min_lr_ratio``:

    - ``cosine``: ``r + (1 - r) * (1 + cos(pi * p)) / 2``;
    - ``linear``: ``r + (1 - r) * (1 - p)``;
    - ``constant``: 1;
    - ``inverse_sqrt``: ``sqrt(max(1, warmup) / (step + 1))`` (fairseq's ``inverse_sqrt``: 1 at the
      end of the warmup, then proportional to the inverse square root of the step; no floor).
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(max(1, warmup) / (step + 1))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    if schedule != "cosine":
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class TrainHistory:
    """What :func:`train` did. ``train``: one record per step ``{"step", "loss", "lr",
    "tokens_per_s", ...}`` (every rank); ``evals``: evaluation records (rank 0 only);
    ``start_step``: the step resumed from (0 for a fresh run); ``stop_reason``: "steps",
    "time_budget" or "interrupted" (a graceful stop through ``stop``); ``checkpoint``: the last
    checkpoint written (None without ``out_dir``); ``schedule``: what a time budget decided
    (one record per estimate: ``{"step", "total_steps", "warmup", "step_s", "budget_s"}``).
    """

    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    start_step: int = 0
    step: int = 0
    stop_reason: str = "steps"
    checkpoint: str | None = None
    seconds: float = 0.0
    schedule: list[dict[str, Any]] = field(default_factory=list)

    @property
    def schedule_steps(self) -> int | None:
        """The schedule length a time budget decided (its last estimate; None when the steps
        were given)."""
        return int(self.schedule[-1]["total_steps"]) if self.schedule else None

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.train]


# ------------------------------------------------------------------------------------------------
# Distributed setup, devices, RNG
# ------------------------------------------------------------------------------------------------


@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def active(self) -> bool:
        return self.world > 1


def _init_distributed(device: str) -> _Dist:
    if dist.is_available() and dist.is_initialized():
        return _Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) <= 1:
        return _Dist()
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RuntimeError(f"WORLD_SIZE is set but {key} is not; launch with torchrun")
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    info = _Dist(dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"]), True)
    logger.info("joined process group: rank %d of %d (%s)", info.rank, info.world, backend)
    return info


def _resolve_device(device: str, d: _Dist) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and d.active:
        return torch.device("cuda", d.local_rank)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _map_tensors(obj: Any, fn) -> Any:
    """Apply ``fn`` to every tensor in a nest of lists / tuples / dicts (recurrent states)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


# ------------------------------------------------------------------------------------------------
# Run checkpoints (the files are effiformer.checkpoint's; the trainer state is this loop's)
# ------------------------------------------------------------------------------------------------


def _save_checkpoint(
    out_dir: Path,
    step: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    task: Any,
    states: list[Any],
    config: TrainConfig,
    d: _Dist,
    plan: dict[str, int],
) -> Path | None:
    """Write the checkpoint of ``step`` (collective under DDP: every rank calls, rank 0 writes).
    Every rank's part carries a checksum of its parameters (``param_checksum``: the float64 sum),
    so that a checkpoint shows the ranks agreed."""
    with torch.no_grad():
        checksum = float(sum(p.detach().double().sum().item() for p in module.parameters()))
    payload = {
        "rng": _rng_state(),
        "states": _map_tensors(states, lambda t: t.detach().cpu()),
        "param_checksum": checksum,
    }
    if d.active:
        gathered: list[Any] | None = [None] * d.world if d.rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        ranks = gathered
    else:
        ranks = [payload]
    if d.rank != 0:
        return None
    trainer_state = {
        "step": step,
        "world": d.world,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "task": task.state_dict(),
        "ranks": ranks,
        "schedule": dict(plan),
    }
    return save_run_checkpoint(
        out_dir,
        step,
        module,
        trainer_state=trainer_state,
        train_config=config.to_dict(),
        task=task,
        model_name=config.model_name,
        world=d.world,
        keep=config.keep_checkpoints,
    )


def _load_training_state(
    directory: Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    task: Any,
    d: _Dist,
    grad_accum: int,
    device: torch.device,
) -> tuple[int, list[Any], dict[str, int] | None]:
    state = read_trainer_state(directory, module, device)
    try:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"the optimiser state in {str(directory)!r} does not fit: {e}") from e
    try:
        task.load_state_dict(state["task"])
    except ValueError as e:
        raise CheckpointError(f"cannot resume from {str(directory)!r}: {e}") from e
    ranks = state["ranks"]
    states: list[Any] = [None] * grad_accum
    if len(ranks) == d.world:
        mine = ranks[d.rank]
        _set_rng_state(mine["rng"])
        if len(mine["states"]) == grad_accum:
            states = _map_tensors(mine["states"], lambda t: t.to(device))
        elif any(s is not None for s in mine["states"]):
            logger.warning("grad_accum changed since the checkpoint: recurrent state restarts")
    else:
        logger.warning(
            "checkpoint was written by %d processes, this run has %d: RNG and recurrent state "
            "restart from rank 0's, so the resumed run is not bitwise identical",
            len(ranks),
            d.world,
        )
        _set_rng_state(ranks[0]["rng"])
    logger.info("resumed from %s at step %d", directory, state["step"])
    plan = state.get("schedule")
    return int(state["step"]), states, (dict(plan) if plan else None)


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


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


def _average_updates(updates: list[dict[str, Tensor]], d: _Dist) -> dict[str, Tensor]:
    if not updates or not updates[-1]:
        return {}
    out = {}
    for k in updates[-1]:
        values = [u[k] for u in updates if k in u]
        v = values[-1]
        if v.is_floating_point():
            v = torch.stack(values).mean(0)
            if d.active:
                dist.all_reduce(v)
                v = v / d.world
        out[k] = v
    return out


class _Metrics:
    """Appends JSON lines to ``OUT/metrics.jsonl`` (rank 0 only)."""

    def __init__(self, path: Path | None, resume_step: int | None) -> None:
        self.path = path
        if path is None:
            return
        if resume_step is not None and path.exists():
            # Drop records of steps after the checkpoint (a killed run may have logged them).
            kept = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    continue
            atomic_write_bytes(path, "".join(line + "\n" for line in kept).encode())
        elif resume_step is None and path.exists():
            path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def train(
    model: nn.Module, task: Any, config: TrainConfig | None = None, *, stop: Any = None
) -> TrainHistory:
    """Train ``model`` on ``task`` in place (see the module docstring); return the history.

    Under ``torchrun`` every process calls this with the same arguments.

    ``stop``: a graceful-stop request (the command line passes its Ctrl-C handler, a
    ``GracefulInterrupt`` of its ``common`` module): any object whose ``requested`` attribute
    becomes true. It is read after every step (under DDP the ranks agree, an all-reduce); once
    true the loop ends after the step in progress, writes a checkpoint of that step (from which
    ``resume`` continues exactly) and returns with ``stop_reason="interrupted"``, skipping the
    final evaluation. If it has an ``abortable()`` context manager, evaluations run inside it
    (its owner may raise ``KeyboardInterrupt`` there to abandon an evaluation; that evaluation is
    then dropped and the run stops as above). Without ``stop`` a ``KeyboardInterrupt``
    propagates as usual and the last checkpoint written stays the newest.
    """
    config = TrainConfig() if config is None else config
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for attr in ("train_batches", "forward", "evaluate", "state_dict", "load_state_dict"):
        if not callable(getattr(task, attr, None)):
            raise TypeError(f"task must implement effiformer.tasks.Task; it lacks {attr}()")
    d = _init_distributed(config.device)
    try:
        history = _train(model, task, config, d, stop)
        if d.owns_group:
            # Every rank is done (rank 0 writes the last checkpoint after the others have sent
            # their part) before any tears the group down: a rank that destroyed its gloo group
            # while rank 0 was still writing was seen to abort at exit.
            dist.barrier()
        return history
    finally:
        if d.owns_group:
            dist.destroy_process_group()


def _now() -> float:
    """The clock of time budgets (a function, so that tests can drive it)."""
    return time.monotonic()


def check_batch_ids(batch: Any, vocab_size: int | None) -> None:
    """Token ids of a batch still on the host, checked before it moves to an accelerator: the
    model reads ids only on CPU tensors (on CUDA that read would be a host sync per forward), so
    this is where a bad id on a GPU run gets its clear error instead of a device-side assert."""
    ids = batch.data["input_ids"]
    if vocab_size is None or ids.device.type != "cpu" or not ids.numel():
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"token id {bad} in a training batch is outside the model's vocabulary "
            f"[0, {vocab_size})"
        )


def _micro_scales(
    micro: list[Any], d: _Dist, device: torch.device
) -> tuple[list[float], list[float], float] | None:
    """How much each micro-batch's mean loss weighs in the step: ``(scales, weights, total
    weight)``, or ``None`` for the plain ``1 / grad_accum`` of equal micro-batches.

    A micro-batch weighs what its :attr:`~effiformer.tasks.Batch.weight` says (its count of
    target tokens, for losses that are per-token means) or, without one, its rows when the rows
    did not split evenly. The step's gradient is then the gradient of the loss over the whole
    global batch: micro-batch ``i`` of rank ``r`` backpropagates ``loss * w * world / W``
    (``W``: the weights of every rank, all-reduced), and DDP's average over ranks divides the
    ``world`` out again.
    """
    weights = [mb.weight for mb in micro]
    if any(w is None for w in weights):
        if len({mb.rows for mb in micro}) == 1:
            return None
        weights = [float(mb.rows) for mb in micro]
    local = float(sum(weights))
    total = local
    if d.active:
        t = torch.tensor([local], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        total = float(t.item())
    if not total > 0:
        raise ValueError("a training batch has no target tokens (every micro-batch weighs 0)")
    return [w * d.world / total for w in weights], weights, total


def _agree(values: list[float], d: _Dist, device: torch.device) -> list[float]:
    """The element-wise maximum of ``values`` over all ranks (stop flags, elapsed time), so that
    every rank takes the same decision."""
    if not d.active:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


class _BudgetPlanner:
    """Sizes the schedule from the time budget (``steps=None``) or warns that a fixed schedule
    will not fit it; see :class:`TrainConfig`. ``plan`` (``total``, ``warmup``) is what the lr
    schedule reads.

    The schedule is sized after the first steps (logged), re-sized at 25, 50 and 75% of the
    budget (logged) from the seconds per step *since the previous sizing* (the first steps of a
    run are slower than the rest, so an average from the start overestimates them), and after
    75% re-sized quietly after every step, so that the step at which the budget runs out is the
    end of the schedule: the decay finishes when the run stops (:meth:`finish` logs where)."""

    MARKS = (0.25, 0.5, 0.75)

    def __init__(self, config: TrainConfig, plan: dict[str, int], start_step: int) -> None:
        self.config = config
        self.plan = plan
        self.start = start_step
        self.t_first: float | None = None  # elapsed when the first step of this call ended
        self.first_done = False
        self.marks = list(self.MARKS)
        self.active = config.time_budget is not None
        self.since: tuple[int, float] | None = None  # (step, elapsed) of the previous sizing
        self.sized = False  # whether this call sized the schedule

    def after_step(self, step: int, elapsed: float) -> dict[str, Any] | None:
        """Called after every step with the budget clock; returns a plan record when it planned
        (and logged); quiet re-sizings after the last mark return None."""
        if not self.active:
            return None
        budget = float(self.config.time_budget)  # type: ignore[arg-type]
        done = step - self.start
        if done == 1:
            self.t_first = elapsed
            self.since = (step, elapsed)
            return None
        if self.t_first is None or done < 2:
            return None
        quiet = False
        if not self.first_done:
            if done < 5 and elapsed < 0.1 * budget:
                return None
        elif not self.marks:
            quiet = self.config.steps is None  # past the last mark: follow the clock
            if not quiet:
                return None
        elif elapsed < self.marks[0] * budget:
            return None
        assert self.since is not None
        s0, e0 = self.since
        step_s = (elapsed - e0) / max(step - s0, 1)
        # whole steps that fit (a hair of tolerance: 4.9 s / 0.1 s is 48.99999 in floating point)
        fits = step + int(max(0.0, budget - elapsed) / max(step_s, 1e-9) + 1e-6)
        first = not self.first_done
        self.first_done = True
        while self.marks and elapsed >= self.marks[0] * budget:
            self.marks.pop(0)
        if self.config.steps is not None:  # a fixed schedule: only say when it cannot fit
            self.active = False
            if fits < self.plan["warmup"]:
                logger.warning(
                    "the time budget (%.0f s at %.3g s/step) fits about %d steps, fewer than the "
                    "warmup (%d of %d steps): the run will end in warmup; leave out steps "
                    "(--steps) to size the schedule from the budget",
                    budget,
                    step_s,
                    fits,
                    self.plan["warmup"],
                    self.config.steps,
                )
            return None
        total = max(fits, step + 1)
        self.sized = True
        if quiet:  # the window stays at the last logged sizing (at least a quarter of the run)
            self.plan["total"] = total
            return None
        self.since = (step, elapsed)
        warmup = self.plan["warmup"]
        note = ""
        if first:
            cap = self.config.planned_warmup_cap
            if cap is not None and step < warmup and warmup > cap * total:  # still warming up
                capped = max(1, int(cap * total), step)
                note = f" (warmup {warmup} capped to {capped}, {cap:.0%} of the run)"
                warmup = capped
        self.plan.update(total=total, warmup=warmup)
        record = {
            "step": step,
            "total_steps": total,
            "warmup": warmup,
            "step_s": step_s,
            "budget_s": budget,
        }
        logger.info(
            "time budget %.0f s at %.3g s/step (steps %d-%d): schedule sized to %d steps, "
            "warmup %d%s",
            budget,
            step_s,
            s0 + 1,
            step,
            total,
            warmup,
            note,
        )
        return record

    def finish(self, step: int) -> dict[str, Any] | None:
        """The schedule's end where this call sized it: the run's last step is its last step
        (the plan is set to end there: a resumed run continues from a finished decay only if it
        is given steps or a new budget). Returns the record to write, or None."""
        if not self.sized:
            return None
        if self.plan["total"] != step:
            logger.info(
                "time budget spent at step %d; the schedule (sized to %d) ends there",
                step,
                self.plan["total"],
            )
        self.plan["total"] = step
        return {"step": step, "total_steps": step, "warmup": self.plan["warmup"], "final": True}


def _train(model: nn.Module, task: Any, config: TrainConfig, d: _Dist, stop: Any) -> TrainHistory:
    from tqdm.contrib.logging import logging_redirect_tqdm

    from .progress import TqdmLoggingHandler, progress_bar, progress_enabled

    t_begin = time.monotonic()
    device = _resolve_device(config.device, d)
    use_bf16 = config.bf16
    if use_bf16 is None:
        use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(use_bf16))

    out_dir = Path(config.out_dir) if config.out_dir is not None else None
    resume_dir = resolve_checkpoint(config.resume) if config.resume is not None else None
    if out_dir is not None:
        if resume_dir is None and (out_dir / LATEST).exists():
            raise ValueError(
                f"out_dir {str(out_dir)!r} already holds a run (it has {LATEST!r}); resume it "
                "(--resume) or choose another output directory"
            )
        if d.rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
    if config.steps is None and config.time_budget is None and resume_dir is None:
        raise ConfigError("steps=None sizes the schedule from time_budget; give one of them")

    if resume_dir is None:
        _seed_everything(config.seed + d.rank)
    module = model.to(device)
    module.train()
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    optimizer = make_optimizer(module, config)
    # What the lr schedule reads: its length and warmup (a time budget may resize them).
    plan = {"total": config.steps or 0, "warmup": config.warmup}

    def schedule(step: int) -> float:
        return lr_factor(
            step,
            warmup=plan["warmup"],
            total=plan["total"] or 10**9,  # not yet sized from the budget: no decay yet
            min_lr_ratio=config.min_lr_ratio,
            schedule=config.schedule,
        )

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    accum = config.grad_accum
    step, states = 0, [None] * accum
    if resume_dir is not None:
        step, states, saved_plan = _load_training_state(
            resume_dir, module, optimizer, scheduler, task, d, accum, device
        )
        if saved_plan is not None and config.steps is None:
            plan.update(saved_plan)  # continue the planned schedule until this call re-plans it
    if config.steps is None and config.time_budget is None and plan["total"] < 1:
        raise ConfigError(
            f"steps=None continues the schedule planned from a time budget, but "
            f"{str(resume_dir)!r} records none; give steps or a time_budget"
        )
    history = TrainHistory(start_step=step, step=step)
    if config.steps is not None:
        limit = float(config.steps)
    elif config.time_budget is not None:
        limit = math.inf  # the budget ends the run
    else:
        limit = float(plan["total"])

    runner: nn.Module = module
    if d.active:
        runner = nn.parallel.DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=config.find_unused_parameters,
        )
    if config.compile is not None:
        runner = torch.compile(runner, backend=config.compile)
        logger.info("training forward and backward under torch.compile(backend=%r)", config.compile)
    batches: Iterator[Any] = task.train_batches(module, d.rank, d.world)
    init_state = getattr(module, "init_state", None)
    apply_updates = getattr(module, "apply_updates", None)
    metric = getattr(task, "metric_name", "metric")
    split_prefix = {"valid": "val", "test": "test", "train": "train"}[config.eval_split]

    is_main = d.rank == 0
    show = bool(config.progress and is_main)
    metrics = _Metrics(
        out_dir / METRICS if (out_dir is not None and is_main) else None,
        step if resume_dir is not None else None,
    )
    abortable = getattr(stop, "abortable", None)
    excluded = 0.0  # seconds the budget does not count (time_budget_counts_eval=False)

    def stop_requested() -> bool:
        return stop is not None and bool(getattr(stop, "requested", False))

    def evaluate() -> None:
        nonlocal excluded
        t0 = _now()
        if is_main:
            guard = abortable() if callable(abortable) else contextlib.nullcontext()
            try:
                with guard, progress_enabled(show):
                    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                        result = task.evaluate(
                            module, config.eval_split, device=device, autocast=autocast()
                        )
            except KeyboardInterrupt:
                if not stop_requested():
                    raise
                logger.warning("evaluation at step %d abandoned (interrupted)", step)
                result = None
            if result is not None:
                record = {"step": step}
                record.update({f"{split_prefix}_{k}": v for k, v in result.items()})
                history.evals.append(record)
                metrics.write(record)
                logger.info(
                    "step %d: %s %s %.4f",
                    step,
                    config.eval_split,
                    metric,
                    result.get(metric, math.nan),
                )
        if d.active:
            dist.barrier()
        if not config.time_budget_counts_eval:
            excluded += _now() - t0

    def kept(loss_at: int | None = None) -> str:
        if history.checkpoint and loss_at is not None and last_ckpt == loss_at - 1:
            return (
                f"the last checkpoint, {history.checkpoint}, holds the weights that gave this "
                "loss: resume from an earlier one (keep_checkpoints / --keep keeps more)"
            )
        if history.checkpoint:
            return f"the last checkpoint, {history.checkpoint}, is unchanged"
        if resume_dir is not None:
            return f"the checkpoint resumed from, {resume_dir}, is unchanged"
        return "no checkpoint was written"

    def diverged(what: str, loss_at: int | None = None) -> FloatingPointError:
        return FloatingPointError(
            f"{what}; lower the learning rate (lr={config.lr}) or enable clipping; {kept(loss_at)}"
        )

    def checkpoint() -> None:
        nonlocal excluded
        if out_dir is None:
            return
        with torch.no_grad():
            finite = all(bool(torch.isfinite(p).all()) for p in module.parameters())
        if not finite:  # never save weights a diverging update broke
            raise diverged(f"the weights are not finite after step {step}")
        t0 = _now()
        path = _save_checkpoint(
            out_dir, step, module, optimizer, scheduler, task, states, config, d, plan
        )
        if path is not None:
            history.checkpoint = str(path)
        if not config.time_budget_counts_eval:
            excluded += _now() - t0

    last_eval = last_ckpt = None
    if step >= limit:
        logger.info("already at step %d of %d: nothing to train", step, int(limit))
    planner = _BudgetPlanner(config, plan, step)
    with progress_enabled(show):
        bar = progress_bar(
            None if math.isinf(limit) else int(limit),
            initial=step,
            desc="train",
            unit="step",
            leave=True,
        )
    # tqdm's redirect swaps console handlers for its own; a handler that already writes through
    # tqdm (the command line's) stays, and redirecting beside it printed every line twice
    routed = any(isinstance(h, TqdmLoggingHandler) for h in logging.getLogger().handlers)
    redirect = logging_redirect_tqdm() if show and not routed else contextlib.nullcontext()
    t_loop = _now()
    interrupted = False
    with redirect:
        try:
            while step < limit:
                checks = []
                if stop is not None:
                    checks.append(float(stop_requested()))
                if config.time_budget is not None:
                    checks.append(_now() - t_loop - excluded)
                checks = _agree(checks, d, device) if checks else checks
                if stop is not None and checks.pop(0):
                    interrupted = True
                    break
                elapsed = checks[0] if checks else 0.0
                if config.time_budget is not None and elapsed >= config.time_budget:
                    history.stop_reason = "time_budget"
                    break
                if planner.active and step > planner.start:
                    record = planner.after_step(step, elapsed)
                    if record is not None:
                        history.schedule.append(record)
                        metrics.write(record)
                        bar.total = record["total_steps"]
                        bar.refresh()
                t0 = time.perf_counter()
                batch = next(batches)
                micro = batch.split(accum) if accum > 1 else [batch]
                weighting = _micro_scales(micro, d, device)
                lr = optimizer.param_groups[0]["lr"]
                optimizer.zero_grad(set_to_none=True)
                loss_sum = torch.zeros((), dtype=torch.float64, device=device)
                aux_sum = torch.zeros((), dtype=torch.float64, device=device)
                updates: list[dict[str, Tensor]] = []
                for m, mb in enumerate(micro):
                    if device.type != "cpu":  # the model checks ids on CPU itself
                        check_batch_ids(mb, vocab_size)
                    mb = mb.to(device)
                    if init_state is not None and (states[m] is None or mb.new_stream):
                        states[m] = init_state(mb.rows, device)
                    sync = (
                        runner.no_sync() if d.active and m < accum - 1 else contextlib.nullcontext()
                    )
                    with sync:
                        with autocast():
                            out = task.forward(runner, mb, states[m])
                            total = out.total_loss
                        if weighting is None:
                            (total / accum).backward()
                        else:
                            (total * weighting[0][m]).backward()
                    states[m] = _map_tensors(out.state, lambda t: t.detach())
                    if weighting is None:
                        loss_sum += out.loss.detach().double()
                        aux_sum += (total - out.loss).detach().double()
                    else:  # weighted sums; divided by the all-reduced weight below
                        w = weighting[1][m]
                        loss_sum += out.loss.detach().double() * w
                        aux_sum += (total - out.loss).detach().double() * w
                    if out.updates:
                        updates.append(out.updates)
                grad_norm = aux_norm = None
                if config.clip is not None and config.optimizer != "adagrad-clip":
                    grad_norm, aux_norm = clip_gradients(module, config.clip)
                    if not math.isfinite(grad_norm):  # raise before the update breaks the weights
                        raise diverged(f"the gradient norm is {grad_norm} at step {step + 1}")
                optimizer.step()
                scheduler.step()
                after_optimizer_step(module)
                if apply_updates is not None:
                    avg = _average_updates(updates, d)
                    if avg:
                        apply_updates(avg)
                if weighting is None:
                    stats = torch.stack([loss_sum, aux_sum]) / accum
                    if d.active:
                        dist.all_reduce(stats)
                        stats = stats / d.world
                else:
                    stats = torch.stack([loss_sum, aux_sum])
                    if d.active:
                        dist.all_reduce(stats)
                    stats = stats / weighting[2]
                loss, aux = (float(v) for v in stats.tolist())
                step += 1
                history.step = step
                if not math.isfinite(loss):
                    raise diverged(f"the training loss is {loss} at step {step}", step)
                dt = time.perf_counter() - t0
                tokens_per_s = batch.num_tokens * d.world / dt
                record = {
                    "step": step,
                    "loss": loss,
                    "lr": lr,
                    "tokens_per_s": tokens_per_s,
                    "step_s": dt,
                }
                if weighting is not None:
                    record["loss_weight"] = weighting[2]  # what the loss averaged over
                if updates or aux:
                    record["total_loss"] = loss + aux
                if grad_norm is not None:
                    record["grad_norm"] = grad_norm
                if aux_norm is not None:
                    record["aux_grad_norm"] = aux_norm
                history.train.append(record)
                if step % config.log_every == 0:
                    metrics.write(record)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
                if config.eval_every is not None and step % config.eval_every == 0:
                    evaluate()
                    last_eval = step
                if config.checkpoint_every is not None and step % config.checkpoint_every == 0:
                    checkpoint()
                    last_ckpt = step
        finally:
            bar.close()
        if history.stop_reason == "time_budget":
            record = planner.finish(step)
            if record is not None:
                history.schedule.append(record)
                metrics.write(record)
        if interrupted:
            logger.info("stopping at step %d (interrupted)", step)
        elif last_eval != step:
            evaluate()
        if interrupted or stop_requested():
            history.stop_reason = "interrupted"
        if last_ckpt != step:
            checkpoint()
    history.seconds = time.monotonic() - t_begin
    return history
