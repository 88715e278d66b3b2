"""What a run leaves: :class:`TrainHistory` (returned) and ``OUT/metrics.jsonl``
(:class:`MetricsLog`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint import atomic_write_bytes

__all__ = ["METRICS", "MetricsLog", "TrainHistory"]

METRICS = "metrics.jsonl"


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


class MetricsLog:
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
