"""What the generated token tasks share (duplication, MQAR): batches that are a pure function of
``(seed, step)``, fixed evaluation sets, and accuracy on the scored targets only.

A :class:`SyntheticTask` subclass provides ``generate(rows, generator) -> (input_ids, targets)``
(both ``(rows, T)``, targets ``-100`` where nothing is scored), ``name`` and ``_settings()`` (what
identifies its data); the base class gives the :class:`~effiformer.tasks.Task` protocol:

- training batch ``i`` is drawn from a generator seeded with ``(seed, i)``, so resuming at step
  ``i`` is exact and any number of DDP ranks see the same global batches;
- the ``valid`` / ``test`` / ``train`` evaluation sets are drawn from fixed seeds of their own;
- :meth:`SyntheticTask.evaluate` reports ``accuracy`` (argmax equal to the target, over scored
  targets), ``loss`` (nats per scored target), ``sequence_accuracy`` (every scored target of a row
  right), under a fixed torch seed so that mechanisms with random parts (LSH rotations) give
  reproducible scores.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from ..models.base import IGNORE_INDEX, ModelOutput
from .base import Batch, rank_rows

__all__ = ["SeededBatches", "SyntheticTask", "build_token_model", "check_int", "derive_seed"]

_SPLIT_OFFSET = {"valid": 1, "test": 2, "train": 3}


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum``; else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (sha256: independent streams for every (seed, step))."""
    digest = hashlib.sha256(",".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class SeededBatches:
    """Training batch ``i`` drawn from ``(seed, i)``: the step counter, its save and restore
    (with the data's fingerprint), and each rank's rows of the global batch. A subclass gives
    ``batch_data(step) -> {name: (batch_size, ...) tensor}``, ``fingerprint()``,
    ``check_model(model)`` and ``batch_size``."""

    _step = 0
    _pending: int | None = None
    batch_size: int

    def batch_data(self, step: int) -> dict[str, Tensor]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def check_model(self, model: nn.Module) -> None:
        raise NotImplementedError

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        self.check_model(model)
        rank_rows(self.batch_size, rank, world)  # an indivisible batch is refused up front
        if self._pending is not None:
            self._step, self._pending = self._pending, None

        def _iterate() -> Iterator[Batch]:
            while True:
                data = self.batch_data(self._step)
                self._step += 1
                # the rank's share of this batch's rows (a task may vary them, as MQAR's
                # training lengths do at a constant number of tokens)
                lo, rows = rank_rows(next(iter(data.values())).shape[0], rank, world)
                yield Batch({k: v[lo : lo + rows] for k, v in data.items()})

        return _iterate()

    def state_dict(self) -> dict[str, Any]:
        step = self._pending if self._pending is not None else self._step
        return {"fingerprint": self.fingerprint(), "step": step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint():
            raise ValueError(
                f"the saved data position is for {state.get('fingerprint')!r}, but this task is "
                f"{self.fingerprint()!r}; resume with the same task settings"
            )
        self._pending = int(state["step"])


class SyntheticTask(SeededBatches):
    """Base of the generated token tasks (see the module docstring).

    ``batch_size``: rows of the global batch; ``seed``: the data seed (training batches and the
    evaluation sets); ``eval_sequences`` / ``eval_batch_size``: size and batching of the fixed
    evaluation sets; ``eval_seed``: the torch seed evaluation runs under.
    """

    metric_name = "accuracy"
    name = "synthetic"
    #: the model reads this many tokens per sequence (set by the subclass)
    model_len: int = 0

    def __init__(
        self,
        *,
        batch_size: int,
        seed: int,
        eval_sequences: int,
        eval_batch_size: int,
        eval_seed: int,
    ) -> None:
        self.batch_size = check_int("batch_size", batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.eval_sequences = check_int("eval_sequences", eval_sequences)
        self.eval_batch_size = check_int("eval_batch_size", eval_batch_size)
        self.eval_seed = int(eval_seed)
        self._step = 0
        self._pending: int | None = None

    # -- what a subclass provides -------------------------------------------------------------

    def generate(self, rows: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    # -- the Task protocol ---------------------------------------------------------------------

    def check_model(self, model: nn.Module) -> None:
        """Refuse a model whose vocabulary, length or causality cannot run this task."""
        config = getattr(model, "config", None)
        if config is None:
            return
        if config.vocab_size < self.vocab_size:
            raise ValueError(
                f"the {self.name} task uses {self.vocab_size} symbols but the model's vocab_size "
                f"is {config.vocab_size}; build the model with vocab_size={self.vocab_size}"
            )
        if config.seq_len < self.model_len and getattr(config, "mem_len", 0) == 0:
            raise ValueError(
                f"the model reads {self.model_len} tokens per sequence but its seq_len is "
                f"{config.seq_len}; build it with seq_len >= {self.model_len}"
            )
        if not getattr(config, "causal", True):
            raise ValueError(f"the {self.name} task needs a causal model (causal=True)")

    # kept for callers of the duplication task's earlier private name
    _check_model = check_model

    def fingerprint(self) -> str:
        return f"{self.name}:" + ":".join(f"{k}={v}" for k, v in self._settings().items())

    def batch(self, step: int) -> tuple[Tensor, Tensor]:
        """The global training batch of optimiser step ``step``: two ``(batch_size, T)``."""
        g = torch.Generator().manual_seed(derive_seed(self.seed, step))
        return self.generate(self.batch_size, g)

    def batch_data(self, step: int) -> dict[str, Tensor]:
        x, y = self.batch(step)
        return {"input_ids": x, "targets": y}

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput:
        """The model on the batch; where the model offers it (``scores_subset``) the output head
        runs only at the scored positions (logits ``(N, V)``), otherwise ``(B, T, V)``."""
        x, y = batch.data["input_ids"], batch.data["targets"]
        kw: dict[str, Any] = {"targets": y}
        if getattr(getattr(model, "module", model), "scores_subset", False):
            kw["scored_only"] = True
        if state is not None:
            kw["state"] = state
        return model(x, **kw)

    def split(self, split: str) -> tuple[Tensor, Tensor]:
        """The fixed evaluation set of ``split`` ("valid", "test" or "train")."""
        if split not in _SPLIT_OFFSET:
            raise ValueError(f"split must be one of {sorted(_SPLIT_OFFSET)}, got {split!r}")
        g = torch.Generator().manual_seed(derive_seed(self.seed, -_SPLIT_OFFSET[split]))
        return self.generate(self.eval_sequences, g)

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """``{"accuracy", "loss" (nats per scored target), "sequence_accuracy" (every scored
        target of the row right), "sequences", "tokens"}`` over the split's fixed sequences."""
        self.check_model(model)
        xs, ys = self.split(split)
        was = model.training
        model.eval()
        dev = torch.device(device)
        nll, correct, tokens, exact = 0.0, 0, 0, 0
        try:
            with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
                torch.manual_seed(self.eval_seed)
                for s in range(0, xs.shape[0], self.eval_batch_size):
                    x = xs[s : s + self.eval_batch_size].to(dev)
                    y = ys[s : s + self.eval_batch_size].to(dev)
                    with autocast if autocast is not None else contextlib.nullcontext():
                        out = self.forward(model, Batch({"input_ids": x, "targets": y}), None)
                    keep = y != IGNORE_INDEX
                    n = int(keep.sum())
                    nll += float(out.loss.double()) * n
                    if out.logits is None:
                        raise ValueError(
                            f"the {self.name} task needs logits for accuracy; build the model "
                            "without loss_chunk"
                        )
                    if out.logits.dim() == 2:  # scored positions only, row-major
                        hit = torch.zeros_like(keep)
                        hit[keep] = out.logits.argmax(-1) == y[keep]
                    else:
                        hit = (out.logits.argmax(-1) == y) & keep
                    correct += int(hit.sum())
                    exact += int((hit.sum(1) == keep.sum(1)).sum())
                    tokens += n
        finally:
            model.train(was)
        return {
            "accuracy": correct / tokens,
            "loss": nll / tokens,
            "sequence_accuracy": exact / xs.shape[0],
            "sequences": xs.shape[0],
            "tokens": tokens,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.name,
            **self._settings(),
            "eval_sequences": self.eval_sequences,
            "eval_batch_size": self.eval_batch_size,
            "eval_seed": self.eval_seed,
            "metric": self.metric_name,
        }

    def artifacts(self) -> dict[str, bytes]:
        return {}


def build_token_model(
    context: Any, *, vocab_size: int, seq_len: int, task: str, causal: bool = True
) -> tuple[nn.Module, str]:
    """The model a generated task trains: the registered ``context.model_name`` (or the config of
    the run ``context.resume``) with the ``--set`` overrides, ``vocab_size`` and ``seq_len`` set
    for the task unless given (given ones must fit it), ``causal`` as the task needs."""
    from ..checkpoint import load_config
    from ..config import parse_overrides, replace_config
    from ..registry import build_model, get_spec

    if context.resume is not None:
        base = load_config(context.resume)
        name = context.model_name or "resumed"
    elif context.model_name is None:
        raise ValueError(f"give a registered model NAME for the {task} task (or --resume DIR)")
    else:
        base = get_spec(context.model_name).config
        name = context.model_name
    overrides = parse_overrides(base, list(context.overrides))
    if "causal" in overrides and overrides["causal"] != causal:
        raise ValueError(
            f"the {task} task needs causal={causal}; drop --set causal={overrides['causal']}"
        )
    if overrides.get("vocab_size", vocab_size) < vocab_size:
        raise ValueError(
            f"the {task} task uses {vocab_size} token ids; --set vocab_size="
            f"{overrides['vocab_size']} is too small"
        )
    if overrides.get("seq_len", seq_len) < seq_len:
        raise ValueError(
            f"the {task} task feeds {seq_len} tokens per sequence; --set seq_len="
            f"{overrides['seq_len']} is too short"
        )
    if context.resume is None:
        overrides.setdefault("vocab_size", vocab_size)
        overrides.setdefault("seq_len", seq_len)
        overrides["causal"] = causal
    config = replace_config(base, **overrides) if overrides else base
    torch.manual_seed(context.seed)
    return build_model(config), name
