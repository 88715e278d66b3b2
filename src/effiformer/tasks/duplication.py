"""The Reformer paper's duplication task (Kitaev, Kaiser, Levskaya 2020, arXiv 2001.04451,
sec. 5 "Effect of sharing QK" / Table 2): sequences ``0 w 0 w`` with ``w`` uniform over symbols
``1 .. vocab_size - 1``; a causal LM must copy ``w``, which needs attention to reach exactly one
position half a sequence back. Paper setting (verify): ``w`` of length 511 (sequences of 1024),
symbols 1..127, a 1-layer model with d_model 256 and 4 heads; accuracy on the copied half.

Training and scoring are on the copied ``w`` only: the model reads ``seq[:-1]`` and predicts
``seq[1:]``; targets before the second ``w`` are ignored (-100), so the loss and accuracy are over
the ``len(w)`` predictions that copying decides (the second separator is position-determined and
not scored).

Data is a pure function of the seed: training batch ``i`` is drawn from a generator seeded with
``(seed, i)`` (so resuming at step ``i`` is exact and any number of DDP ranks see the same global
batches), the validation and test sets from fixed seeds. LSH rotations are random at evaluation
too; :meth:`DuplicationTask.evaluate` runs under a fixed torch seed so a result is reproducible,
and :func:`evaluate_with_hashes` evaluates one trained model with several hash counts (rebuilt
with :func:`~effiformer.models.reformer.reconfigure`, the same weights).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from ..models.base import IGNORE_INDEX, ModelOutput
from ..models.reformer import reconfigure
from . import Batch, rank_rows

__all__ = ["DuplicationTask", "duplication_batch", "evaluate_with_hashes"]

_SPLIT_OFFSET = {"valid": 1, "test": 2, "train": 3}


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _seed(*parts: int) -> int:
    digest = hashlib.sha256(",".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def duplication_batch(
    rows: int, seq_len: int, vocab_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``rows`` sequences ``0 w 0 w`` of ``seq_len`` tokens (even) as (input_ids, targets),
    each (rows, seq_len - 1); targets are -100 except where they are the copied ``w``."""
    half = seq_len // 2
    w = torch.randint(1, vocab_size, (rows, half - 1), generator=generator)
    zero = torch.zeros(rows, 1, dtype=torch.long)
    seq = torch.cat([zero, w, zero, w], dim=1)  # (rows, seq_len)
    x, y = seq[:, :-1], seq[:, 1:].clone()
    y[:, :half] = IGNORE_INDEX  # targets 0 .. half-1 are the first 0 w 0: not scored
    return x.contiguous(), y


class DuplicationTask:
    """The duplication task (see the module docstring).

    ``seq_len``: tokens per sequence ``0 w 0 w`` (even, >= 4; the model reads ``seq_len - 1``);
    ``vocab_size``: symbols 0..vocab_size-1 (0 is the separator); ``batch_size``: rows of the
    global batch; ``eval_sequences`` / ``eval_batch_size``: size and batching of the fixed
    validation and test sets; ``eval_seed``: the torch seed evaluation runs under (LSH rotations).
    """

    metric_name = "accuracy"

    def __init__(
        self,
        *,
        seq_len: int = 1024,
        vocab_size: int = 128,
        batch_size: int = 16,
        seed: int = 0,
        eval_sequences: int = 256,
        eval_batch_size: int = 16,
        eval_seed: int = 0,
    ) -> None:
        self.seq_len = _positive_int("seq_len", seq_len, 4)
        if seq_len % 2:
            raise ValueError(f"seq_len must be even (0 w 0 w), got {seq_len}")
        self.vocab_size = _positive_int("vocab_size", vocab_size, 2)
        self.batch_size = _positive_int("batch_size", batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.eval_sequences = _positive_int("eval_sequences", eval_sequences)
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        self.eval_seed = int(eval_seed)
        self._step = 0
        self._pending: int | None = None

    def _check_model(self, model: nn.Module) -> None:
        config = getattr(model, "config", None)
        if config is None:
            return
        if config.vocab_size < self.vocab_size:
            raise ValueError(
                f"the duplication task uses {self.vocab_size} symbols but the model's vocab_size "
                f"is {config.vocab_size}; build the model with vocab_size={self.vocab_size}"
            )
        if config.seq_len < self.seq_len - 1:
            raise ValueError(
                f"the model reads {self.seq_len - 1} tokens per sequence but its seq_len is "
                f"{config.seq_len}; build it with seq_len >= {self.seq_len - 1}"
            )
        if not getattr(config, "causal", True):
            raise ValueError("the duplication task needs a causal model (causal=True)")

    def fingerprint(self) -> str:
        return f"duplication:L{self.seq_len}:V{self.vocab_size}:B{self.batch_size}:S{self.seed}"

    def batch(self, step: int) -> tuple[Tensor, Tensor]:
        """The global training batch of optimiser step ``step``: (batch_size, seq_len - 1) x 2."""
        g = torch.Generator().manual_seed(_seed(self.seed, step))
        return duplication_batch(self.batch_size, self.seq_len, self.vocab_size, g)

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        self._check_model(model)
        lo, rows = rank_rows(self.batch_size, rank, world)
        if self._pending is not None:
            self._step, self._pending = self._pending, None

        def _iterate() -> Iterator[Batch]:
            while True:
                x, y = self.batch(self._step)
                self._step += 1
                yield Batch({"input_ids": x[lo : lo + rows], "targets": y[lo : lo + rows]})

        return _iterate()

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput:
        x, y = batch.data["input_ids"], batch.data["targets"]
        return model(x, targets=y) if state is None else model(x, targets=y, state=state)

    def split(self, split: str) -> tuple[Tensor, Tensor]:
        """The fixed evaluation set of ``split`` ("valid", "test" or "train")."""
        if split not in _SPLIT_OFFSET:
            raise ValueError(f"split must be one of {sorted(_SPLIT_OFFSET)}, got {split!r}")
        g = torch.Generator().manual_seed(_seed(self.seed, -_SPLIT_OFFSET[split]))
        return duplication_batch(self.eval_sequences, self.seq_len, self.vocab_size, g)

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """``{"accuracy", "loss" (nats per copied token), "sequences", "tokens",
        "sequence_accuracy" (whole w copied)}`` over the split's fixed sequences."""
        self._check_model(model)
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
                            "the duplication task needs logits for accuracy; build the model "
                            "without loss_chunk"
                        )
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

    def describe(self) -> dict[str, Any]:
        return {
            "task": "duplication",
            "seq_len": self.seq_len,
            "vocab_size": self.vocab_size,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "eval_sequences": self.eval_sequences,
            "eval_batch_size": self.eval_batch_size,
            "eval_seed": self.eval_seed,
            "metric": self.metric_name,
            "chance_accuracy": 1.0 / (self.vocab_size - 1),
        }

    def artifacts(self) -> dict[str, bytes]:
        return {}

    def __repr__(self) -> str:
        return (
            f"DuplicationTask(seq_len={self.seq_len}, vocab_size={self.vocab_size}, "
            f"batch_size={self.batch_size}, seed={self.seed})"
        )


def evaluate_with_hashes(
    model: nn.Module,
    task: DuplicationTask,
    hashes: Sequence[int] = (1, 2, 4, 8),
    *,
    split: str = "test",
    device: torch.device | str = "cpu",
) -> dict[int, dict[str, float]]:
    """The same trained weights evaluated with each hash count in ``hashes`` (the paper's
    Table 2 columns): ``{n_hashes: task.evaluate(...)}``."""
    out = {}
    for n in hashes:
        _positive_int("n_hashes", n)
        out[n] = task.evaluate(reconfigure(model, n_hashes=n), split, device=device)
    return out
