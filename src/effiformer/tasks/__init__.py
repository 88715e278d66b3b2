"""Tasks: what :func:`effiformer.train.train` trains on and how it is scored.

A task owns its data, its batching (and the batching's resumable position), the model call
convention and the metric. The trainer owns everything else (optimiser, schedule, accumulation,
DDP, checkpoints), so one training loop serves every task:

``train_batches(model, rank, world)``
    an iterator over this rank's share of each *global* training batch, in order: rows
    ``[rank * B / world, (rank + 1) * B / world)`` of a batch of ``B`` rows, so any number of
    processes sees the same global batches. ``model`` is the unwrapped model (the task may pick
    its batching from it, e.g. contiguous streams for models with recurrent memory).
``forward(model, batch, state) -> ModelOutput``
    one forward pass with loss; ``state`` is the explicit recurrent state of these rows (``None``
    for stateless models).
``evaluate(model, split, *, device, autocast) -> dict``
    metrics over a split, e.g. ``{"bpc": .., "loss": .., "tokens": ..}``; ``metric_name`` names the
    headline key.
``state_dict()`` / ``load_state_dict(state)``
    the data position (for exact resume) plus what identifies the data (a corpus fingerprint);
    loading a state from other data raises.
``describe()`` / ``artifacts()``
    a JSON-able description recorded in checkpoints, and extra files saved beside the weights
    (the vocabulary).

:class:`Batch` is what ``train_batches`` yields: named tensors with rows first, which the trainer
slices along dim 0 into micro-batches for gradient accumulation.

Tasks are registered by name (:mod:`.registry`: ``register_task`` / ``get_task`` / ``list_tasks``)
with their options as a frozen dataclass and a builder; ``effiformer train --task NAME`` and
``effiformer eval`` resolve through it. The task modules register themselves when this package
imports them, from the explicit list below: ``lm``, ``mlm``, ``electra``, ``glue-sst2``,
``glue-cola``, ``glue-rte``, ``glue-mrpc``, ``glue-stsb``, ``translation``, ``mqar``,
``duplication``, ``listops``.
"""

# isort: off
from . import lm, mlm, glue, translation, mqar, duplication, listops  # noqa: F401  (registration order: lm, mlm/electra, glue-*, translation, mqar, duplication, listops)

# isort: on
from .base import Batch, Task, rank_rows, restore_position
from .glue import GlueTask
from .lm import LMTask
from .mlm import MLMTask
from .registry import (
    BuildContext,
    EvalReport,
    TaskSetup,
    TaskSpec,
    UnknownTaskError,
    get_task,
    list_tasks,
    register_task,
    task_option,
)
from .translation import TranslationTask

__all__ = [
    "Batch",
    "BuildContext",
    "EvalReport",
    "GlueTask",
    "LMTask",
    "MLMTask",
    "Task",
    "TaskSetup",
    "TaskSpec",
    "TranslationTask",
    "UnknownTaskError",
    "get_task",
    "list_tasks",
    "rank_rows",
    "register_task",
    "restore_position",
    "task_option",
]
