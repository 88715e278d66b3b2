"""``train(model, task, config) -> history``: one resumable training loop for every model and task.

* Optimiser: AdamW (Loshchilov & Hutter 2019, arXiv 1711.05101), weight decay on matrices only
  (``p.dim() >= 2``; biases, norms and 1-D parameters are not decayed).
* Schedule: linear warmup then cosine decay (Loshchilov & Hutter 2017, arXiv 1608.03983, one
  cycle, no restarts) as a ``LambdaLR`` factor, see :func:`lr_factor`.
* Step: the global batch of ``task.batch_size`` rows is split across DDP ranks, then into
  ``grad_accum`` equal micro-batches; each micro-batch differentiates
  ``out.total_loss / grad_accum`` (task loss plus aux losses), so accumulation changes memory use,
  not the result. Then gradient clipping (global norm; parameters trained only by an aux loss,
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
* Evaluation every ``eval_every`` steps and at the end, under a forked RNG so it never changes
  the training trajectory. Records go to ``OUT/metrics.jsonl``: ``{"step", "loss", "lr",
  "tokens_per_s"}`` per training step and ``{"step", "val_bpc" | "val_ppl", "val_loss",
  "val_tokens"}`` per evaluation.

Checkpoints (every ``checkpoint_every`` steps and at the end) are directories
``OUT/step-00000100/`` holding ``model.safetensors`` + ``config.json`` (:func:`effiformer.save_model`),
the task's files (``vocab.json``), ``trainer.pt`` (optimiser, scheduler, the RNG states of every
rank (python, numpy, torch CPU and CUDA), the data position, the step, the recurrent state),
``train_config.json`` and, written last, ``meta.json`` with the size and sha256 of every file. A
checkpoint is written into ``OUT/.step-00000100.tmp/``, renamed into place, and only then is
``OUT/latest`` (the name of the newest complete checkpoint) replaced atomically; older
checkpoints beyond ``keep_checkpoints`` are removed after that. So a run killed at any moment
leaves ``latest`` pointing at a complete checkpoint, and resuming from it on CPU reproduces the
uninterrupted run's losses bitwise (tested; a resume with another number of processes or
another ``grad_accum`` is allowed but restarts RNG / recurrent state, with a warning).

``effiformer eval`` refuses a corpus whose fingerprint differs from the one recorded at training
(a clear error; ``--allow-other-corpus`` turns it into a warning), and always refuses a corpus
whose vocabulary differs from the saved ``vocab.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_model as _st_load_model
from torch import Tensor, nn

from .checkpoint import CONFIG, WEIGHTS, CheckpointError, atomic_write_bytes, save_model
from .config import ConfigError

__all__ = [
    "TrainConfig",
    "TrainHistory",
    "train",
    "lr_factor",
    "clip_gradients",
    "after_optimizer_step",
    "resolve_checkpoint",
    "verify_checkpoint",
    "load_checkpoint",
    "add_train_arguments",
    "run_train_cli",
    "add_eval_arguments",
    "run_eval_cli",
]

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer.pt"
TRAIN_CONFIG = "train_config.json"
META = "meta.json"
LATEST = "latest"
METRICS = "metrics.jsonl"
_CKPT_FORMAT = "effiformer-train-checkpoint"
_CKPT_VERSION = 1


# ------------------------------------------------------------------------------------------------
# Configuration and schedule
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train (the data, batch size and sequence length belong to the task).

    ``steps``: optimiser steps in all (the schedule's length; on resume, the total including the
    steps already done). ``time_budget``: stop after this many seconds of this call, whichever
    of the two comes first. ``clip``: max global gradient norm (None: no clipping).
    ``bf16``: autocast to bfloat16 (None: on for CUDA with bf16, off on CPU). ``eval_every`` /
    ``checkpoint_every``: None means only at the end. ``out_dir``: where checkpoints and
    ``metrics.jsonl`` go (None: no files). ``resume``: a run directory (with ``latest``) or one
    checkpoint directory to continue from. ``keep_checkpoints``: how many of the newest
    checkpoints to keep (None: all).
    """

    steps: int = 1000
    lr: float = 1e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_accum: int = 1
    clip: float | None = 1.0
    seed: int = 0
    device: str = "auto"
    bf16: bool | None = None
    time_budget: float | None = None
    eval_every: int | None = 200
    eval_split: str = "valid"
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = 1
    out_dir: str | None = None
    resume: str | None = None
    log_every: int = 1
    progress: bool = True
    model_name: str | None = None
    find_unused_parameters: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "grad_accum", "log_every"):
            _check_int(name, getattr(self, name), 1)
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


def lr_factor(step: int, *, warmup: int, total: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimiser step ``step + 1`` (``step`` steps done).

    Warmup: ``(step + 1) / warmup`` for ``step < warmup`` (the ``warmup``-th step reaches the
    peak). Then cosine from 1 down to ``min_lr_ratio`` over the remaining ``total - warmup``
    steps: ``r + (1 - r) * (1 + cos(pi * p)) / 2`` with ``p = (step - warmup) / (total - warmup)``
    clipped to [0, 1].
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class TrainHistory:
    """What :func:`train` did. ``train``: one record per step ``{"step", "loss", "lr",
    "tokens_per_s", ...}`` (every rank); ``evals``: evaluation records (rank 0 only);
    ``start_step``: the step resumed from (0 for a fresh run); ``stop_reason``: "steps" or
    "time_budget"; ``checkpoint``: the last checkpoint written (None without ``out_dir``).
    """

    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    start_step: int = 0
    step: int = 0
    stop_reason: str = "steps"
    checkpoint: str | None = None
    seconds: float = 0.0

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
# Checkpoints
# ------------------------------------------------------------------------------------------------


def _step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint directory ``path`` names: itself, or ``path/<latest>`` for a run directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint directory {str(p)!r} does not exist")
    if not p.is_dir():
        raise CheckpointError(f"{str(p)!r} is not a directory (expected a checkpoint directory)")
    if (p / META).exists() or (p / CONFIG).exists() or (p / TRAINER_STATE).exists():
        return p
    if (p / LATEST).is_file():
        name = (p / LATEST).read_text().strip()
        target = p / name
        if not name or not target.is_dir():
            raise CheckpointError(
                f"{str(p / LATEST)!r} points at {name!r}, which is not a checkpoint directory"
            )
        return target
    raise CheckpointError(
        f"{str(p)!r} holds no checkpoint (no {META} and no {LATEST!r} pointer to one)"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_checkpoint(directory: str | os.PathLike) -> dict[str, Any]:
    """Check that every file of a training checkpoint is present and intact; return its meta.

    Raises :class:`CheckpointError` naming a missing, truncated or altered file.
    """
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {str(d)!r} does not exist")
    meta_path = d / META
    if not meta_path.is_file():
        raise CheckpointError(
            f"checkpoint {str(d)!r} is incomplete: it has no {META} (written last by a save, so "
            "the save was interrupted or this is not a training checkpoint)"
        )
    try:
        meta = json.loads(meta_path.read_text())
        files = meta["files"]
        if meta.get("format") != _CKPT_FORMAT:
            raise KeyError("format")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{str(meta_path)!r} is not a valid checkpoint meta file: {e}") from e
    for name, info in files.items():
        p = d / name
        if not p.is_file():
            raise CheckpointError(f"checkpoint {str(d)!r} is missing {name}")
        size = p.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(
                f"checkpoint file {str(p)!r} is truncated or altered: {size} bytes, "
                f"expected {info['bytes']}"
            )
        if _sha256(p) != info["sha256"]:
            raise CheckpointError(f"checkpoint file {str(p)!r} is corrupt (sha256 mismatch)")
    return meta


def _fsync_dir_files(d: Path) -> None:
    for p in d.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())


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
) -> Path | None:
    """Write the checkpoint of ``step`` (collective under DDP: every rank calls, rank 0 writes)."""
    payload = {
        "rng": _rng_state(),
        "states": _map_tensors(states, lambda t: t.detach().cpu()),
    }
    if d.active:
        gathered: list[Any] | None = [None] * d.world if d.rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        ranks = gathered
    else:
        ranks = [payload]
    if d.rank != 0:
        return None
    name = _step_dir_name(step)
    final = out_dir / name
    latest = out_dir / LATEST
    if latest.is_file() and latest.read_text().strip() == name and final.is_dir():
        logger.info("checkpoint %s already holds step %d", final, step)
        return final
    tmp = out_dir / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(module, tmp, name=config.model_name)
    artifacts = getattr(task, "artifacts", None)
    for fname, data in (artifacts() if artifacts is not None else {}).items():
        (tmp / fname).write_bytes(data)
    trainer_state = {
        "step": step,
        "world": d.world,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "task": task.state_dict(),
        "ranks": ranks,
    }
    torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / TRAIN_CONFIG).write_text(json.dumps(config.to_dict(), indent=2))
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())
    }
    meta = {
        "format": _CKPT_FORMAT,
        "version": _CKPT_VERSION,
        "step": step,
        "world": d.world,
        "model_name": config.model_name,
        "task": task.describe() if hasattr(task, "describe") else {},
        "torch": torch.__version__,
        "files": files,
    }
    (tmp / META).write_text(json.dumps(meta, indent=2))
    _fsync_dir_files(tmp)
    if final.exists():  # a leftover of an interrupted save; latest does not point at it
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_bytes(latest, name.encode())
    _prune_checkpoints(out_dir, keep=config.keep_checkpoints, latest=name)
    logger.info("saved checkpoint %s", final)
    return final


def _prune_checkpoints(out_dir: Path, *, keep: int | None, latest: str) -> None:
    for p in out_dir.glob(".step-*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    if keep is None:
        return
    steps = sorted(p for p in out_dir.glob("step-*") if p.is_dir() and p.name != latest)
    for p in steps[: max(0, len(steps) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)


def _json_normal(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _check_config_matches(directory: Path, module: nn.Module) -> None:
    try:
        record = json.loads((directory / CONFIG).read_text())
        saved_family, saved = record["family"], record["config"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {str(directory)!r} has no valid {CONFIG}: {e}") from e
    config = getattr(module, "config", None)
    if config is None:
        return
    if saved_family != config.family:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is a {saved_family!r} model, not {config.family!r}"
        )
    current = _json_normal(config.to_dict())
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r}, model {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is from another configuration: {'; '.join(diffs)}"
        )


def _load_weights(module: nn.Module, directory: Path, device: torch.device) -> None:
    path = directory / WEIGHTS
    try:
        missing, unexpected = _st_load_model(module, path, strict=False, device=str(device))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CheckpointError(
            f"{str(path)!r} is truncated or corrupt, or its shapes do not match the config: {e}"
        ) from e
    if missing or unexpected:
        raise CheckpointError(
            f"{str(path)!r} does not match the model: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
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
) -> tuple[int, list[Any]]:
    verify_checkpoint(directory)
    _check_config_matches(directory, module)
    _load_weights(module, directory, device)
    try:
        state = torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated pickles raise many types
        raise CheckpointError(f"{str(directory / TRAINER_STATE)!r} cannot be read: {e}") from e
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
    return int(state["step"]), states


def load_checkpoint(
    directory: str | os.PathLike,
    *,
    map_location: str | torch.device = "cpu",
    overrides: dict[str, Any] | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a training checkpoint (a run directory or one checkpoint directory).

    ``overrides``: config fields to change that do not change the weights' shapes (``mem_len``).
    Returns ``(model, meta)``; ``meta["task"]`` describes the data it was trained on.
    """
    from .checkpoint import load_config
    from .config import replace_config
    from .registry import build_model

    d = resolve_checkpoint(directory)
    meta = verify_checkpoint(d)
    config = load_config(d)
    if overrides:
        config = replace_config(config, **overrides)
    model = build_model(config)
    _load_weights(model, d, torch.device(map_location))
    meta["path"] = str(d)
    return model, meta


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


def _make_optimizer(module: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for p in module.parameters():  # parameters() yields tied weights once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


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


def train(model: nn.Module, task: Any, config: TrainConfig | None = None) -> TrainHistory:
    """Train ``model`` on ``task`` in place (see the module docstring); return the history.

    Under ``torchrun`` every process calls this with the same arguments.
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
        history = _train(model, task, config, d)
        if d.owns_group:
            # Every rank is done (rank 0 writes the last checkpoint after the others have sent
            # their part) before any tears the group down: a rank that destroyed its gloo group
            # while rank 0 was still writing was seen to abort at exit.
            dist.barrier()
        return history
    finally:
        if d.owns_group:
            dist.destroy_process_group()


def _train(model: nn.Module, task: Any, config: TrainConfig, d: _Dist) -> TrainHistory:
    from tqdm.auto import tqdm

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

    if resume_dir is None:
        _seed_everything(config.seed + d.rank)
    module = model.to(device)
    module.train()
    optimizer = _make_optimizer(module, config)

    def schedule(step: int) -> float:
        return lr_factor(
            step, warmup=config.warmup, total=config.steps, min_lr_ratio=config.min_lr_ratio
        )

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    accum = config.grad_accum
    step, states = 0, [None] * accum
    if resume_dir is not None:
        step, states = _load_training_state(
            resume_dir, module, optimizer, scheduler, task, d, accum, device
        )
    history = TrainHistory(start_step=step, step=step)

    runner: nn.Module = module
    if d.active:
        runner = nn.parallel.DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=config.find_unused_parameters,
        )
    batches: Iterator[Any] = task.train_batches(module, d.rank, d.world)
    init_state = getattr(module, "init_state", None)
    apply_updates = getattr(module, "apply_updates", None)
    metric = getattr(task, "metric_name", "metric")
    split_prefix = {"valid": "val", "test": "test", "train": "train"}[config.eval_split]

    is_main = d.rank == 0
    metrics = _Metrics(
        out_dir / METRICS if (out_dir is not None and is_main) else None,
        step if resume_dir is not None else None,
    )

    def evaluate() -> None:
        if is_main:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                result = task.evaluate(
                    module, config.eval_split, device=device, autocast=autocast()
                )
            record = {"step": step}
            record.update({f"{split_prefix}_{k}": v for k, v in result.items()})
            history.evals.append(record)
            metrics.write(record)
            logger.info(
                "step %d: %s %s %.4f", step, config.eval_split, metric, result.get(metric, math.nan)
            )
        if d.active:
            dist.barrier()

    def checkpoint() -> None:
        if out_dir is None:
            return
        path = _save_checkpoint(
            out_dir, step, module, optimizer, scheduler, task, states, config, d
        )
        if path is not None:
            history.checkpoint = str(path)

    last_eval = last_ckpt = None
    if step >= config.steps:
        logger.info("already at step %d of %d: nothing to train", step, config.steps)
    bar = tqdm(
        total=config.steps,
        initial=step,
        desc="train",
        file=sys.stderr,
        disable=not (config.progress and is_main),
        dynamic_ncols=True,
    )
    t_loop = time.monotonic()
    try:
        while step < config.steps:
            if config.time_budget is not None and time.monotonic() - t_loop >= config.time_budget:
                history.stop_reason = "time_budget"
                break
            t0 = time.perf_counter()
            batch = next(batches)
            micro = batch.split(accum) if accum > 1 else [batch]
            lr = optimizer.param_groups[0]["lr"]
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            aux_sum = torch.zeros((), dtype=torch.float64, device=device)
            updates: list[dict[str, Tensor]] = []
            for m, mb in enumerate(micro):
                mb = mb.to(device)
                if init_state is not None and (states[m] is None or mb.new_stream):
                    states[m] = init_state(mb.rows, device)
                sync = runner.no_sync() if d.active and m < accum - 1 else contextlib.nullcontext()
                with sync:
                    with autocast():
                        out = task.forward(runner, mb, states[m])
                        total = out.total_loss
                    (total / accum).backward()
                states[m] = _map_tensors(out.state, lambda t: t.detach())
                loss_sum += out.loss.detach().double()
                aux_sum += (total - out.loss).detach().double()
                if out.updates:
                    updates.append(out.updates)
            grad_norm = aux_norm = None
            if config.clip is not None:
                grad_norm, aux_norm = clip_gradients(module, config.clip)
            optimizer.step()
            scheduler.step()
            after_optimizer_step(module)
            if apply_updates is not None:
                avg = _average_updates(updates, d)
                if avg:
                    apply_updates(avg)
            stats = torch.stack([loss_sum, aux_sum]) / accum
            if d.active:
                dist.all_reduce(stats)
                stats = stats / d.world
            loss, aux = (float(v) for v in stats.tolist())
            step += 1
            history.step = step
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"the training loss is {loss} at step {step}; lower the learning rate "
                    f"(lr={config.lr}) or enable clipping"
                )
            dt = time.perf_counter() - t0
            tokens_per_s = batch.num_tokens * d.world / dt
            record = {"step": step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_s}
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
    if last_eval != step:
        evaluate()
    if last_ckpt != step:
        checkpoint()
    history.seconds = time.monotonic() - t_begin
    return history


# ------------------------------------------------------------------------------------------------
# CLI glue (called by effiformer.cli)
# ------------------------------------------------------------------------------------------------


def _setup_cli_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if int(os.environ.get("RANK", "0")) != 0:
        logging.getLogger("effiformer").setLevel(logging.WARNING)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    from .data import FORMATS

    p.add_argument("name", nargs="?", help="registered model name (optional with --resume)")
    p.add_argument(
        "--task",
        default="lm",
        choices=TASK_CHOICES,
        help="lm (default): language modelling on --data/--format or the embedded corpus; "
        "mlm/electra: pretraining on --text or --data/--format (subword tokenizer trained and "
        "saved); glue-*: fine-tune the pretraining run --init on the task folder --data",
    )
    p.add_argument("--text", help="mlm/electra: UTF-8 text file or folder to pretrain on")
    p.add_argument("--tokenizer", help="mlm/electra: an existing tokenizer.json")
    p.add_argument("--vocab-size", type=int, help="mlm/electra: subword vocabulary size")
    p.add_argument("--init", help="glue-*: pretraining run or checkpoint to fine-tune")
    p.add_argument("--max-len", type=int, help="glue-*: max tokens per example (default 128)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, repeatable (vocab_size comes from the corpus)",
    )
    p.add_argument("--data", help="corpus path (default: the embedded Python stdlib corpus)")
    p.add_argument("--format", choices=FORMATS, help="corpus format of --data")
    p.add_argument("--batch", type=int, help="global batch size in rows (default 16)")
    p.add_argument("--seq-len", type=int, help="tokens per row (default: the model's seq_len)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=int, help="linear warmup steps (default min(100, steps/10))")
    p.add_argument("--grad-accum", type=int, help="micro-batches per step (default 1)")
    p.add_argument("--clip", type=float, help="gradient clipping norm, 0 = off (default 1.0)")
    p.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0.1)")
    p.add_argument("--seed", type=int, help="seed of weights, dropout and data order (default 0)")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on for CUDA with bf16, off on CPU)",
    )
    p.add_argument("--steps", type=int, help="total optimiser steps (default 1000)")
    p.add_argument("--time-budget", type=float, help="stop after this many seconds")
    p.add_argument(
        "--eval-every", type=int, help="evaluate every N steps (default 200; 0 = end only)"
    )
    p.add_argument(
        "--eval-tokens",
        type=int,
        help="evaluate on the first N tokens of the split (default 100000; 0 = all)",
    )
    p.add_argument(
        "--checkpoint-every", type=int, help="checkpoint every N steps (default: end only)"
    )
    p.add_argument("--keep", type=int, help="checkpoints to keep (default 1)")
    p.add_argument("--out", help="output directory (default runs/NAME, or the --resume run)")
    p.add_argument("--resume", help="run or checkpoint directory to continue from")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _load_cli_corpus(data: str | None, fmt: str | None):
    from .data import embedded_corpus, load_corpus

    if data is None:
        if fmt is not None:
            raise ValueError("--format needs --data PATH")
        return embedded_corpus(), None
    if fmt is None:
        raise ValueError(
            "--data needs --format (one of enwik8, text8, ptb, ptb-char, wikitext, text)"
        )
    return load_corpus(data, fmt), {"path": str(Path(data).resolve()), "format": fmt}


def _pick(value: Any, saved: dict[str, Any], key: str, default: Any) -> Any:
    if value is not None:
        return value
    return saved.get(key, default)


TASK_CHOICES = (
    "lm",
    "mlm",
    "electra",
    "glue-sst2",
    "glue-cola",
    "glue-rte",
    "glue-mrpc",
    "glue-stsb",
)

# Flags of `effiformer train` forwarded to the pretraining / fine-tuning entry points.
_MLM_FLAGS = {
    "text": "--text", "data": "--data", "format": "--format", "tokenizer": "--tokenizer",
    "vocab_size": "--vocab-size", "batch": "--batch", "seq_len": "--seq-len", "steps": "--steps",
    "lr": "--lr", "warmup": "--warmup", "time_budget": "--time-budget",
    "eval_every": "--eval-every", "seed": "--seed", "device": "--device", "out": "--out",
}  # fmt: skip
_GLUE_FLAGS = {
    "init": "--init", "data": "--data", "batch": "--batch", "max_len": "--max-len",
    "steps": "--steps", "lr": "--lr", "warmup": "--warmup", "time_budget": "--time-budget",
    "eval_every": "--eval-every", "seed": "--seed", "device": "--device", "out": "--out",
}  # fmt: skip


def _forward_flags(args: argparse.Namespace, flags: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for attr, flag in flags.items():
        value = getattr(args, attr, None)
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _run_other_task(args: argparse.Namespace) -> int:
    """`effiformer train --task mlm|electra|glue-*`: the same trainer through the task's entry."""
    lm_only = [f for f in ("resume", "grad_accum", "checkpoint_every") if getattr(args, f, None)]
    if lm_only:
        raise ValueError(f"--task {args.task} does not take --{lm_only[0].replace('_', '-')}")
    if args.task in ("mlm", "electra"):
        from .tasks.mlm import main as mlm_main

        if args.name is None:
            raise ValueError(f"--task {args.task} needs a registered model NAME")
        if args.out is None:
            raise ValueError(f"--task {args.task} needs --out DIR")
        argv = [args.name, "--objective", args.task, *_forward_flags(args, _MLM_FLAGS)]
        for key_value in args.set:
            argv += ["--set", key_value]
        return mlm_main(argv)
    from .tasks.glue import main as glue_main

    if args.init is None or args.data is None or args.out is None:
        raise ValueError(f"--task {args.task} needs --init RUN, --data TASK_FOLDER and --out DIR")
    if args.set:
        raise ValueError("--task glue-* takes its architecture from --init; --set is not allowed")
    if args.eval_every == 0:  # "end only", as for --task lm
        args = argparse.Namespace(**{**vars(args), "eval_every": args.steps or 1000})
    argv = [
        "finetune",
        "--task",
        args.task.removeprefix("glue-"),
        *_forward_flags(args, _GLUE_FLAGS),
    ]
    return glue_main(argv)


def run_train_cli(args: argparse.Namespace) -> int:
    if getattr(args, "task", "lm") != "lm":
        return _run_other_task(args)
    from .checkpoint import load_config
    from .config import parse_overrides, replace_config
    from .registry import build_model, get_config, get_spec
    from .tasks import LMTask

    _setup_cli_logging()
    saved_train: dict[str, Any] = {}
    saved_task: dict[str, Any] = {}
    if args.resume is not None:
        ckpt = resolve_checkpoint(args.resume)
        meta = verify_checkpoint(ckpt)
        saved_task = meta.get("task", {})
        saved_train = json.loads((ckpt / TRAIN_CONFIG).read_text())
        name = args.name or meta.get("model_name")
        if args.name and meta.get("model_name") and args.name != meta["model_name"]:
            raise CheckpointError(
                f"--resume {args.resume!r} holds a {meta['model_name']!r} run, not {args.name!r}"
            )
        base = load_config(ckpt)
        run_dir = ckpt.parent if (ckpt.parent / LATEST).is_file() else ckpt
    else:
        if args.name is None:
            raise ValueError("give a registered model NAME (or --resume DIR)")
        name = args.name
        base = get_spec(name).config
        run_dir = None
    data = args.data if args.data is not None else (saved_task.get("data") or {}).get("path")
    fmt = args.format if args.data is not None else (saved_task.get("data") or {}).get("format")
    corpus, data_spec = _load_cli_corpus(data, fmt)

    overrides = parse_overrides(type(base), args.set)
    if "vocab_size" in overrides and overrides["vocab_size"] != corpus.vocab.size:
        raise ConfigError(
            f"--set vocab_size={overrides['vocab_size']} disagrees with the corpus "
            f"{corpus.name!r}, which has {corpus.vocab.size} token types (vocab_size is set from "
            "the corpus; drop the override)"
        )
    if args.resume is None:
        overrides["vocab_size"] = corpus.vocab.size
        model_config = get_config(name, **overrides)
    else:
        model_config = replace_config(base, **overrides) if overrides else base

    seed = _pick(args.seed, saved_train, "seed", 0)
    torch.manual_seed(seed)
    model = build_model(model_config)
    eval_tokens = _pick(args.eval_tokens, saved_task, "eval_tokens", 100_000)
    task = LMTask(
        corpus,
        batch_size=_pick(args.batch, saved_task, "batch_size", 16),
        seq_len=_pick(args.seq_len, saved_task, "seq_len", model_config.seq_len),
        seed=seed,
        eval_tokens=eval_tokens or None,
        data_spec=data_spec,
    )
    clip = _pick(args.clip, saved_train, "clip", 1.0)
    eval_every = _pick(args.eval_every, saved_train, "eval_every", 200)
    out = args.out or (str(run_dir) if run_dir is not None else str(Path("runs") / name))
    steps = _pick(args.steps, saved_train, "steps", 1000)
    config = TrainConfig(
        steps=steps,
        lr=_pick(args.lr, saved_train, "lr", 1e-3),
        warmup=_pick(args.warmup, saved_train, "warmup", min(100, max(1, steps // 10))),
        weight_decay=_pick(args.weight_decay, saved_train, "weight_decay", 0.1),
        grad_accum=_pick(args.grad_accum, saved_train, "grad_accum", 1),
        clip=clip or None,
        seed=seed,
        device=_pick(args.device, saved_train, "device", "auto"),
        bf16=_pick(args.bf16, saved_train, "bf16", None),
        time_budget=args.time_budget,
        eval_every=eval_every or None,
        checkpoint_every=_pick(args.checkpoint_every, saved_train, "checkpoint_every", None),
        keep_checkpoints=_pick(args.keep, saved_train, "keep_checkpoints", 1),
        out_dir=out,
        resume=args.resume,
        progress=not args.no_progress,
        model_name=name,
    )
    history = train(model, task, config)
    if int(os.environ.get("RANK", "0")) == 0:
        last = history.evals[-1] if history.evals else {}
        key = f"val_{task.metric_name}"
        val = f"; {config.eval_split} {task.metric_name} {last[key]:.4f}" if key in last else ""
        print(
            f"trained {name} on {corpus.name} to step {history.step} "
            f"(stopped: {history.stop_reason}) in {history.seconds:.1f} s{val}; "
            f"checkpoint {history.checkpoint}; metrics {Path(out) / METRICS}"
        )
    return 0


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    from .data import FORMATS

    p.add_argument("checkpoint", help="run directory (uses its latest checkpoint) or checkpoint")
    p.add_argument("--data", help="corpus path (default: the corpus recorded at training)")
    p.add_argument("--format", choices=FORMATS, help="corpus format of --data")
    p.add_argument("--split", default="valid", choices=("valid", "test"), help="default valid")
    p.add_argument("--seq-len", type=int, help="evaluation window (default: the training seq_len)")
    p.add_argument("--mem-len", type=int, help="memory length for models with memory")
    p.add_argument("--batch", type=int, help="evaluation streams (default: as in training)")
    p.add_argument("--eval-tokens", type=int, help="evaluate only the first N tokens (default all)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    p.add_argument(
        "--allow-other-corpus",
        action="store_true",
        help="evaluate on a corpus whose fingerprint differs from the training one "
        "(the vocabulary must still be identical)",
    )


def run_eval_cli(args: argparse.Namespace) -> int:
    from .data import Vocab
    from .tasks import LMTask

    _setup_cli_logging()
    ckpt = resolve_checkpoint(args.checkpoint)
    task_name = verify_checkpoint(ckpt).get("task", {}).get("task", "lm")
    if str(task_name).startswith("glue-"):
        from .tasks.glue import main as glue_main

        split = {"valid": "dev"}.get(args.split, args.split)
        argv = ["eval", str(ckpt), "--split", split]
        return glue_main(argv + (["--data", args.data] if args.data else []))
    if task_name != "lm":
        raise ValueError(
            f"{str(ckpt)!r} is a {task_name!r} pretraining checkpoint; its validation figures are "
            "in the run's metrics.jsonl, and `effiformer train --task glue-* --init RUN` "
            "fine-tunes it"
        )
    device = _resolve_device(args.device, _Dist())
    overrides = {"mem_len": args.mem_len} if args.mem_len is not None else None
    model, meta = load_checkpoint(ckpt, map_location=device, overrides=overrides)
    model.to(device)
    saved_task = meta.get("task", {})
    vocab_path = ckpt / "vocab.json"
    if not vocab_path.is_file():
        raise CheckpointError(f"checkpoint {str(ckpt)!r} has no vocab.json")
    vocab = Vocab.from_json(vocab_path.read_text())
    saved_data = saved_task.get("data") or {}
    data = args.data if args.data is not None else saved_data.get("path")
    fmt = args.format if args.data is not None else saved_data.get("format")
    corpus, _ = _load_cli_corpus(data, fmt)
    if corpus.fingerprint != saved_task.get("fingerprint"):
        msg = (
            f"the corpus {corpus.name!r} (fingerprint {corpus.fingerprint}) is not the one "
            f"{str(ckpt)!r} was trained on ({saved_task.get('corpus')!r}, fingerprint "
            f"{saved_task.get('fingerprint')})"
        )
        if not args.allow_other_corpus:
            raise CheckpointError(msg + "; pass --allow-other-corpus to evaluate anyway")
        logger.warning("%s", msg)
    if corpus.vocab != vocab:
        raise CheckpointError(
            f"the corpus vocabulary ({corpus.vocab}) differs from the checkpoint's ({vocab}); "
            "ids would mean different tokens"
        )
    task = LMTask(
        corpus,
        batch_size=1,
        seq_len=args.seq_len or saved_task.get("seq_len") or model.config.seq_len,
        eval_batch_size=args.batch or saved_task.get("eval_batch_size") or 8,
        eval_tokens=args.eval_tokens or None,
    )
    task._check_model(model)
    result = task.evaluate(model, args.split, device=device)
    record = {
        "checkpoint": str(ckpt),
        "step": meta.get("step"),
        "model": meta.get("model_name"),
        "corpus": corpus.name,
        "fingerprint": corpus.fingerprint,
        "split": args.split,
        "seq_len": task.seq_len,
        **result,
    }
    print(json.dumps(record))
    print(
        f"{meta.get('model_name')} step {meta.get('step')}: {args.split} "
        f"{task.metric_name} {result[task.metric_name]:.4f} "
        f"(loss {result['loss']:.4f} nats/token over {result['tokens']} tokens of {corpus.name})"
    )
    return 0
