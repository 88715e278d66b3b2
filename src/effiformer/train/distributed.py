"""Data parallelism under ``torchrun`` (DDP): joining the process group, the device of this
rank, and what the ranks agree on: stop flags and clocks (:func:`agree`), the weights of
micro-batches over all ranks (:func:`micro_scales`) and averaged buffer updates
(:func:`average_updates`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Dist", "agree", "average_updates", "init_distributed", "micro_scales", "resolve_device"]

logger = logging.getLogger(__name__)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def active(self) -> bool:
        return self.world > 1


def init_distributed(device: str) -> Dist:
    if dist.is_available() and dist.is_initialized():
        return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) <= 1:
        return Dist()
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RuntimeError(f"WORLD_SIZE is set but {key} is not; launch with torchrun")
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    info = Dist(dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"]), True)
    logger.info("joined process group: rank %d of %d (%s)", info.rank, info.world, backend)
    return info


def resolve_device(device: str, d: Dist) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and d.active:
        return torch.device("cuda", d.local_rank)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def agree(values: list[float], d: Dist, device: torch.device) -> list[float]:
    """The element-wise maximum of ``values`` over all ranks (stop flags, elapsed time), so that
    every rank takes the same decision."""
    if not d.active:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def average_updates(updates: list[dict[str, Tensor]], d: Dist) -> dict[str, Tensor]:
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


def micro_scales(
    micro: list[Any], d: Dist, device: torch.device
) -> tuple[list[float], list[float], float] | None:
    """How much each micro-batch's mean loss weighs in the step: ``(scales, weights, total
    weight)``, or ``None`` for the plain ``1 / grad_accum`` of equal micro-batches.

    A micro-batch weighs what its :attr:`~effiformer.tasks.Batch.weight` says (its count of
    target tokens, for losses that are per-token means) or, without one, its rows when the rows
    did not split evenly. The step's gradient is then the gradient of the loss over the whole
    global batch: micro-batch ``i`` of rank ``r`` backpropagates ``loss * w * world / W``
    (``W``: the weights of every rank, all-reduced), and DDP's average over ranks divides the
    ``world`` out again.
    """
    weights = [mb.weight for mb in micro]
    if any(w is None for w in weights):
        if len({mb.rows for mb in micro}) == 1:
            return None
        weights = [float(mb.rows) for mb in micro]
    local = float(sum(weights))
    total = local
    if d.active:
        t = torch.tensor([local], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        total = float(t.item())
    if not total > 0:
        raise ValueError("a training batch has no target tokens (every micro-batch weighs 0)")
    return [w * d.world / total for w in weights], weights, total
