"""Checkpoint averaging: the element-wise mean of the weights of a run's last N checkpoints, as
the translation papers evaluate (Vaswani et al. 2017, sec. 6.1: the last 5 checkpoints, written
every 10 minutes, for the base models; Lite Transformer and HAT average the last 10 with
fairseq's ``scripts/average_checkpoints.py``).

:func:`average_run` writes the average as a run of its own (``OUT/latest`` -> ``OUT/step-N``, N
the newest checkpoint's step), with the newest checkpoint's config, task description and task
files (vocabulary, tokenizer, language pair), so ``effiformer eval OUT`` and ``effiformer
translate OUT`` take it like any run. Floating-point tensors are averaged in float64 and cast
back; integer buffers (counters) and every non-parameter state are the newest checkpoint's.
It is not a run to ``--resume``: its ``trainer.pt`` records only where the weights came from.
"""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import (
    CONFIG,
    LATEST,
    META,
    TRAIN_CONFIG,
    TRAINER_STATE,
    WEIGHTS,
    CheckpointError,
    RecordedTask,
    load_checkpoint,
    save_run_checkpoint,
)

__all__ = ["run_checkpoints", "average_run"]


def run_checkpoints(run: str | os.PathLike) -> list[Path]:
    """The complete checkpoints of a run folder (``step-*`` with a ``meta.json``), oldest
    first."""
    root = Path(run)
    if not root.is_dir():
        raise CheckpointError(f"run folder {str(root)!r} does not exist")
    steps = [d for d in root.glob("step-*") if d.is_dir() and (d / META).is_file()]
    return sorted(steps, key=lambda d: int(d.name.split("-")[1]))


def average_run(run: str | os.PathLike, last: int, out: str | os.PathLike) -> Path:
    """Average the weights of the ``last`` newest checkpoints of ``run`` into the run ``out``;
    returns the checkpoint written. A run keeps as many checkpoints as ``effiformer train
    --keep`` said (``--checkpoint-every`` writes them): fewer than ``last`` is an error that
    says so, and ``out`` must not hold a run yet."""
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"last must be a positive integer, got {last!r}")
    out = Path(out)
    if (out / LATEST).exists():
        raise CheckpointError(f"--out {str(out)!r} already holds a run; choose another folder")
    found = run_checkpoints(run)
    if len(found) < last:
        raise CheckpointError(
            f"{str(run)!r} keeps {len(found)} checkpoint(s) ({', '.join(d.name for d in found)}), "
            f"fewer than the {last} to average; train with --checkpoint-every N --keep {last} "
            "(or more)"
        )
    chosen = found[-last:]
    model, meta = load_checkpoint(chosen[-1])
    sums = {k: v.double().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    for d in chosen[:-1]:
        other, _ = load_checkpoint(d)
        state = other.state_dict()
        for k in sums:
            if state[k].shape != sums[k].shape:
                raise CheckpointError(f"{d} and {chosen[-1]} hold models of different shapes ({k})")
            sums[k] += state[k].double()
    merged = model.state_dict()
    for k, v in sums.items():
        merged[k] = (v / last).to(merged[k].dtype)
    model.load_state_dict(merged)
    newest = chosen[-1]
    skip = {WEIGHTS, CONFIG, META, TRAINER_STATE, TRAIN_CONFIG}
    files = {p.name: p.read_bytes() for p in newest.iterdir() if p.is_file() and p.name not in skip}
    sources = [str(d) for d in chosen]
    return save_run_checkpoint(
        out,
        int(meta["step"]),
        model,
        trainer_state={"averaged": sources},
        train_config={"averaged": sources, "kind": "checkpoint-average"},
        task=RecordedTask(meta.get("task") or {}, files),
        model_name=meta.get("model_name"),
    )
