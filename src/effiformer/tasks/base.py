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
    """

    data: dict[str, Tensor]
    new_stream: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "input_ids" not in self.data:
            raise ValueError(f"Batch.data must hold 'input_ids', got keys {sorted(self.data)}")
        rows = {t.shape[0] for t in self.data.values()}
        if len(rows) != 1:
            raise ValueError(f"every tensor of a Batch must have the same rows, got {rows}")

    @property
    def rows(self) -> int:
        return self.data["input_ids"].shape[0]

    @property
    def num_tokens(self) -> int:
        """Input tokens in this batch (for tokens/s)."""
        return self.data["input_ids"].numel()

    def split(self, parts: int) -> list[Batch]:
        """``parts`` equal row slices (for gradient accumulation); rows must divide evenly.
        Every slice keeps the batch's ``meta`` (what the update shares, e.g. HAT's sampled
        SubTransformer)."""
        if self.rows % parts:
            raise ValueError(f"cannot split {self.rows} rows into {parts} equal parts")
        n = self.rows // parts
        return [
            Batch(
                {k: v[i * n : (i + 1) * n] for k, v in self.data.items()},
                self.new_stream,
                self.meta,
            )
            for i in range(parts)
        ]

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.data.items()}, self.new_stream, self.meta)


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
