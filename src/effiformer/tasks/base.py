"""What every task shares: the :class:`Batch` a task yields and the :class:`Task` protocol the
trainer calls (both owned by the loop, :mod:`effiformer.train.task`, and re-exported here), plus
the row split of a global batch across ranks, data positions and devices."""

from __future__ import annotations

from typing import Any

import torch

from ..train.task import Batch, Task

__all__ = ["Batch", "Task", "rank_rows", "resolve_device", "restore_position"]


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
