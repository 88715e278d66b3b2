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
  (:func:`~effiformer.train.distributed.micro_scales`), which keeps a per-token mean loss exact under accumulation and DDP. Then gradient clipping (global norm; parameters trained only by an aux loss,
  ``model.aux_parameters()``, and those a module lists in ``own_clip_parameters()``, e.g.
  Adaptive Span's span ratios, are clipped as groups of their own, :func:`clip_gradients`), the
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

The package, one concern a module: :mod:`~effiformer.train.task` (the :class:`Batch` and
:class:`Task` protocol the loop calls), :mod:`~effiformer.train.config` (:class:`TrainConfig`,
the schedule), :mod:`~effiformer.train.optimizer` (parameter groups, clipping, post-step hooks),
:mod:`~effiformer.train.distributed` (DDP: ranks, agreement, micro-batch weights),
:mod:`~effiformer.train.state` (RNG and recurrent state, run checkpoints),
:mod:`~effiformer.train.budget` (time budgets), :mod:`~effiformer.train.history` (records) and
:mod:`~effiformer.train.loop` (:func:`train`).
"""

from __future__ import annotations

from .config import TrainConfig, lr_factor
from .history import METRICS, TrainHistory
from .loop import train
from .optimizer import ClipNorms, after_optimizer_step, clip_gradients, make_optimizer
from .task import Batch, Task, check_batch_ids

__all__ = [
    "METRICS",
    "Batch",
    "ClipNorms",
    "Task",
    "TrainConfig",
    "TrainHistory",
    "after_optimizer_step",
    "check_batch_ids",
    "clip_gradients",
    "lr_factor",
    "make_optimizer",
    "train",
]
