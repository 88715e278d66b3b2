"""The trainer's state beyond the weights: RNG states of every library, recurrent state, and the
run checkpoint that holds them (the files are :mod:`effiformer.checkpoint`'s; what goes into
``trainer.pt`` is decided here)."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..checkpoint import CheckpointError, read_trainer_state, save_run_checkpoint
from .config import TrainConfig
from .distributed import Dist

__all__ = [
    "load_training_state",
    "map_tensors",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
]

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def map_tensors(obj: Any, fn) -> Any:
    """Apply ``fn`` to every tensor in a nest of lists / tuples / dicts (recurrent states)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def save_checkpoint(
    out_dir: Path,
    step: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    task: Any,
    states: list[Any],
    config: TrainConfig,
    d: Dist,
    plan: dict[str, int],
) -> Path | None:
    """Write the checkpoint of ``step`` (collective under DDP: every rank calls, rank 0 writes).
    Every rank's part carries a checksum of its parameters (``param_checksum``: the float64 sum),
    so that a checkpoint shows the ranks agreed."""
    with torch.no_grad():
        checksum = float(sum(p.detach().double().sum().item() for p in module.parameters()))
    payload = {
        "rng": rng_state(),
        "states": map_tensors(states, lambda t: t.detach().cpu()),
        "param_checksum": checksum,
    }
    if d.active:
        gathered: list[Any] | None = [None] * d.world if d.rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        ranks = gathered
    else:
        ranks = [payload]
    if d.rank != 0:
        return None
    trainer_state = {
        "step": step,
        "world": d.world,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "task": task.state_dict(),
        "ranks": ranks,
        "schedule": dict(plan),
    }
    return save_run_checkpoint(
        out_dir,
        step,
        module,
        trainer_state=trainer_state,
        train_config=config.to_dict(),
        task=task,
        model_name=config.model_name,
        world=d.world,
        keep=config.keep_checkpoints,
    )


def load_training_state(
    directory: Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    task: Any,
    d: Dist,
    grad_accum: int,
    device: torch.device,
) -> tuple[int, list[Any], dict[str, int] | None]:
    state = read_trainer_state(directory, module, device)
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
        set_rng_state(mine["rng"])
        if len(mine["states"]) == grad_accum:
            states = map_tensors(mine["states"], lambda t: t.to(device))
        elif any(s is not None for s in mine["states"]):
            logger.warning("grad_accum changed since the checkpoint: recurrent state restarts")
    else:
        logger.warning(
            "checkpoint was written by %d processes, this run has %d: RNG and recurrent state "
            "restart from rank 0's, so the resumed run is not bitwise identical",
            len(ranks),
            d.world,
        )
        set_rng_state(ranks[0]["rng"])
    logger.info("resumed from %s at step %d", directory, state["step"])
    plan = state.get("schedule")
    return int(state["step"]), states, (dict(plan) if plan else None)
