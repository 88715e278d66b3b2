"""What the trainer trains on: the :class:`Batch` a task yields and the :class:`Task` protocol
the loop calls (the tasks themselves live in :mod:`effiformer.tasks`, above the loop).

A task yields batches (``train_batches``), turns one into a :class:`ModelOutput` with its loss
(``forward``), scores a split (``evaluate``), and saves / restores its data position
(``state_dict`` / ``load_state_dict``) so that a resumed run sees the batches the uninterrupted
one would have. ``metric_name`` (the number the logs show), ``describe`` and ``artifacts`` (what
a run checkpoint records beside the weights, for ``effiformer eval``) are optional: the loop and
the checkpoint fall back without them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # the loop never builds outputs, it reads their fields
    from ..models.base import ModelOutput

__all__ = ["REQUIRED", "Batch", "Task", "check_batch_ids", "check_task"]

#: The methods :func:`~effiformer.train.train` calls on every task.
REQUIRED = ("train_batches", "forward", "evaluate", "state_dict", "load_state_dict")


@dataclass(frozen=True)
class Batch:
    """Named tensors, every one with rows first ``(R, ...)``; ``input_ids`` is required.

    ``new_stream``: the rows start new contiguous streams, so recurrent state restarts.
    ``weights``: optional ``(R,)`` weight of each row in the loss, for tasks whose loss is a mean
    over a varying number of targets per row (translation: each row's target tokens). The
    trainer weighs micro-batches and DDP ranks by their sum (:attr:`weight`), so that their
    mean losses combine into the mean over the whole global batch; without weights, micro-batches
    of equal rows weigh the same (and unequal ones by their rows).
    """

    data: dict[str, Tensor]
    new_stream: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    weights: Tensor | None = None

    def __post_init__(self) -> None:
        if "input_ids" not in self.data:
            raise ValueError(f"Batch.data must hold 'input_ids', got keys {sorted(self.data)}")
        rows = {t.shape[0] for t in self.data.values()}
        if len(rows) != 1:
            raise ValueError(f"every tensor of a Batch must have the same rows, got {rows}")
        if self.weights is not None and tuple(self.weights.shape) != (self.rows,):
            raise ValueError(
                f"Batch.weights must have shape ({self.rows},), one per row, got "
                f"{tuple(self.weights.shape)}"
            )

    @property
    def weight(self) -> float | None:
        """The sum of :attr:`weights` (None without them)."""
        return None if self.weights is None else float(self.weights.sum())

    @property
    def rows(self) -> int:
        return self.data["input_ids"].shape[0]

    @property
    def num_tokens(self) -> int:
        """Input tokens in this batch (for tokens/s)."""
        return self.data["input_ids"].numel()

    def split(self, parts: int) -> list[Batch]:
        """``parts`` consecutive row slices (for gradient accumulation), as equal as can be
        (``torch.tensor_split``: the first ``rows % parts`` get one row more); each keeps its
        rows' :attr:`weights` and the batch's ``meta`` (what the update shares, e.g. HAT's sampled
        SubTransformer). Fewer rows than ``parts`` is an error."""
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            raise ValueError(f"parts must be a positive int, got {parts!r}")
        if self.rows < parts:
            raise ValueError(
                f"cannot split a batch of {self.rows} rows into {parts} micro-batches; use fewer "
                "micro-batches (grad_accum) or larger batches"
            )
        pieces = {k: torch.tensor_split(v, parts) for k, v in self.data.items()}
        weights = torch.tensor_split(self.weights, parts) if self.weights is not None else None
        return [
            Batch(
                {k: v[i] for k, v in pieces.items()},
                self.new_stream,
                self.meta,
                weights=None if weights is None else weights[i],
            )
            for i in range(parts)
        ]

    def to(self, device: torch.device | str) -> Batch:
        """The tensors on ``device`` (the weights stay where they are: only their sum is read)."""
        return Batch(
            {k: v.to(device) for k, v in self.data.items()},
            self.new_stream,
            self.meta,
            self.weights,
        )


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task (see the module docstring)."""

    metric_name: str

    def train_batches(self, model: nn.Module, rank: int, world: int) -> Iterator[Batch]: ...

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput: ...

    def evaluate(
        self,
        model: nn.Module,
        split: str,
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def artifacts(self) -> dict[str, bytes]: ...


def check_task(task: Any) -> None:
    """A clear ``TypeError`` naming the first of :data:`REQUIRED` that ``task`` lacks."""
    for attr in REQUIRED:
        if not callable(getattr(task, attr, None)):
            raise TypeError(f"task must implement effiformer.tasks.Task; it lacks {attr}()")


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
