"""What every task shares: the :class:`Batch` a task yields and the :class:`Task` protocol the
trainer calls (see :mod:`effiformer.tasks`), plus the row split of a global batch across ranks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..models.base import ModelOutput

__all__ = ["Batch", "Task", "rank_rows", "resolve_device", "restore_position"]


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


def rank_rows(batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """(first row, row count) of this rank's equal share of a global batch of ``batch_size``."""
    if batch_size % world:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by the number of processes ({world}); "
            "every rank takes an equal share of the global batch"
        )
    rows = batch_size // world
    return rank * rows, rows


def restore_position(batcher: Any, position: dict[str, Any]) -> None:
    """Load a saved data position into ``batcher`` with an error that says what failed."""
    try:
        batcher.load_state_dict(position)
    except ValueError as e:
        raise ValueError(f"cannot restore the data position: {e}") from e


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; a CUDA device without CUDA is an error."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev
