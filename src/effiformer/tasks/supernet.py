"""SuperTransformer training: one SubTransformer sampled per update (HAT sec. 3.1, official
``train.py``: ``sample_configs(..., reset_rand_seed=True, rand_seed=trainer.get_num_updates())``).

:class:`SuperNetTask` wraps any task whose model takes ``sample=`` (a
:class:`~effiformer.models.hat.SuperTransformer`; in practice a
:class:`~effiformer.tasks.translation.TranslationTask`) and changes two things:

- ``train_batches``: every global batch it yields carries, in ``batch.meta["sample"]``, a
  SubTransformer drawn uniformly from the design space (every choice independently, every layer
  slot) by a generator seeded with ``(seed, update)`` alone
  (:func:`~effiformer.models.hat.sample_generator`), where ``update`` counts the batches drawn.
  The count is part of the task's ``state_dict``, so a resumed run draws exactly the samples the
  uninterrupted run would have, and every DDP rank draws the same one. The trainer's micro-batches
  (:meth:`~effiformer.tasks.base.Batch.split`, which keeps ``meta``) all carry the update's
  sample: gradient accumulation shares it;
- ``forward``: calls the inner task's ``forward`` with the model bound to the batch's sample
  (``functools.partial(model, sample=...)``: the call still goes through the DDP wrapper).

No trainer change is needed: the sample is data of the batch, decided by the task from the number
of updates it has served. ``evaluate`` scores HAT's two representative SubTransformers (the
official ``get_represent_configs``: the largest and the smallest, both attending to the last two
encoder layers): the headline metric and loss are the largest one's, the smallest one's come as
``smallest_*``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from ..models.base import ModelOutput
from ..models.hat import DesignSpace, SubTransformer, SuperTransformer, get_space, sample_generator
from .base import Batch

__all__ = ["SuperNetTask", "representative_subtransformers"]


def representative_subtransformers(space: DesignSpace) -> dict[str, SubTransformer]:
    """HAT's validation SubTransformers: ``largest`` and ``smallest``, attending to the last two
    encoder layers (the last one when the space does not reach two)."""
    attend = 2 if 2 in space.attend else max(space.attend)
    return {
        "largest": space.largest(attend=attend),
        "smallest": space.smallest(attend=attend),
    }


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DistributedDataParallel


class SuperNetTask:
    """``inner``: the task (its data, batching, loss and metric); ``space``: the design space to
    sample from (None: the model's ``config.space``); ``seed``: of the per-update draws;
    ``eval_subtransformers``: name -> SubTransformer scored by ``evaluate`` (None: the
    representative ones; the first is the headline)."""

    def __init__(
        self,
        inner: Any,
        space: DesignSpace | str | None = None,
        *,
        seed: int = 0,
        eval_subtransformers: dict[str, SubTransformer] | None = None,
    ) -> None:
        for attr in ("train_batches", "forward", "evaluate", "state_dict", "load_state_dict"):
            if not callable(getattr(inner, attr, None)):
                raise TypeError(f"inner must be a task; it lacks {attr}()")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.inner = inner
        self.space = None if space is None else get_space(space)
        self.seed = seed
        self.eval_subtransformers = eval_subtransformers
        self._step = 0

    @property
    def metric_name(self) -> str:
        return getattr(self.inner, "metric_name", "loss")

    def _space(self, model: nn.Module) -> DesignSpace:
        if self.space is not None:
            return self.space
        m = _unwrap(model)
        if not isinstance(m, SuperTransformer):
            raise TypeError(
                f"SuperNetTask trains a SuperTransformer, got {type(m).__name__}; or give space="
            )
        return m.config.space

    def sample_for(self, update: int, model: nn.Module | None = None) -> SubTransformer:
        """The SubTransformer update ``update`` (0-based) trains."""
        space = self.space if model is None else self._space(model)
        if space is None:
            raise ValueError("sample_for needs the model (or a task built with space=)")
        return space.sample(sample_generator(self.seed, update))

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        space = self._space(model)
        batches = self.inner.train_batches(model, rank, world)

        def _iterate() -> Iterator[Batch]:
            for batch in batches:
                sample = space.sample(sample_generator(self.seed, self._step))
                self._step += 1
                yield Batch(batch.data, batch.new_stream, {**batch.meta, "sample": sample})

        return _iterate()

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput:
        sample = batch.meta.get("sample")
        if sample is None:
            raise ValueError("this batch carries no SubTransformer (meta['sample']); it did not "
                             "come from SuperNetTask.train_batches")  # fmt: skip
        return self.inner.forward(functools.partial(model, sample=sample), batch, state)

    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, Any]:
        m = _unwrap(model)
        subs = self.eval_subtransformers or representative_subtransformers(self._space(m))
        out: dict[str, Any] = {}
        for i, (name, sub) in enumerate(subs.items()):
            result = self.inner.evaluate(m.bind(sub), split, device=device, autocast=autocast)
            if i == 0:
                out.update(result)
            out.update({f"{name}_{k}": v for k, v in result.items() if isinstance(v, int | float)})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "updates": self._step, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(
                f"the run sampled SubTransformers with seed {state.get('seed')}, this task has "
                f"seed {self.seed}: resume with the same seed"
            )
        self.inner.load_state_dict(state["inner"])
        self._step = int(state.get("updates", 0))

    def describe(self) -> dict[str, Any]:
        inner = self.inner.describe() if hasattr(self.inner, "describe") else {}
        space = None if self.space is None else self.space.to_dict()
        return {**inner, "supernet": {"seed": self.seed, "space": space}}

    def artifacts(self) -> dict[str, bytes]:
        return self.inner.artifacts() if hasattr(self.inner, "artifacts") else {}

    def __repr__(self) -> str:
        return f"SuperNetTask({self.inner!r}, seed={self.seed})"
