"""How to train: :class:`TrainConfig` and the learning-rate schedule (:func:`lr_factor`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError
from ..recipes import NO_DECAY_RULES, OPTIMIZERS, SCHEDULES

__all__ = ["TrainConfig", "lr_factor", "schedule_function"]


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


def schedule_function(config: TrainConfig, plan: dict[str, int]):
    """The ``LambdaLR`` factor of ``config``'s schedule, reading its length and warmup from
    ``plan`` at every call (a time budget resizes them while the run goes; ``total`` 0: not yet
    sized, no decay yet). A plain function, so that the scheduler's state holds no lambdas."""

    def schedule(step: int) -> float:
        return lr_factor(
            step,
            warmup=plan["warmup"],
            total=plan["total"] or 10**9,
            min_lr_ratio=config.min_lr_ratio,
            schedule=config.schedule,
        )

    return schedule
