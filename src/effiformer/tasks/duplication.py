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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..models.base import IGNORE_INDEX
from ..models.reformer import reconfigure
from .registry import BuildContext, TaskSetup, register_task, task_option
from .synthetic import SyntheticTask, build_token_model, check_int

__all__ = [
    "DuplicationOptions",
    "DuplicationTask",
    "build_duplication",
    "duplication_batch",
    "evaluate_with_hashes",
]


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


class DuplicationTask(SyntheticTask):
    """The duplication task (see the module docstring).

    ``seq_len``: tokens per sequence ``0 w 0 w`` (even, >= 4; the model reads ``seq_len - 1``);
    ``vocab_size``: symbols 0..vocab_size-1 (0 is the separator); ``batch_size``: rows of the
    global batch; ``eval_sequences`` / ``eval_batch_size``: size and batching of the fixed
    validation and test sets; ``eval_seed``: the torch seed evaluation runs under (LSH rotations).
    """

    name = "duplication"

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
        self.seq_len = check_int("seq_len", seq_len, 4)
        if seq_len % 2:
            raise ValueError(f"seq_len must be even (0 w 0 w), got {seq_len}")
        self._vocab = check_int("vocab_size", vocab_size, 2)
        super().__init__(
            batch_size=batch_size,
            seed=seed,
            eval_sequences=eval_sequences,
            eval_batch_size=eval_batch_size,
            eval_seed=eval_seed,
        )
        self.model_len = self.seq_len - 1

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def generate(self, rows: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return duplication_batch(rows, self.seq_len, self._vocab, generator)

    def _settings(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "vocab_size": self._vocab,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def fingerprint(self) -> str:
        return f"duplication:L{self.seq_len}:V{self._vocab}:B{self.batch_size}:S{self.seed}"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "chance_accuracy": 1.0 / (self._vocab - 1)}

    def __repr__(self) -> str:
        return (
            f"DuplicationTask(seq_len={self.seq_len}, vocab_size={self._vocab}, "
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
        check_int("n_hashes", n)
        out[n] = task.evaluate(reconfigure(model, n_hashes=n), split, device=device)
    return out


@dataclass(frozen=True, kw_only=True)
class DuplicationOptions:
    """``effiformer train NAME --task duplication`` options."""

    seq_len: int = task_option(1024, "tokens of 0 w 0 w (even; the model reads seq_len - 1)")
    vocab: int = task_option(128, "symbols, 0 the separator", flag="--vocab")
    batch: int = task_option(16, "sequences per global batch")
    eval_sequences: int = task_option(256, "sequences in each evaluation set")

    def __post_init__(self) -> None:
        DuplicationTask(
            seq_len=self.seq_len,
            vocab_size=self.vocab,
            batch_size=self.batch,
            eval_sequences=self.eval_sequences,
        )


def build_duplication(options: DuplicationOptions, context: BuildContext) -> TaskSetup:
    """The ``duplication`` task: a causal model of the registered NAME sized for the task."""
    task = DuplicationTask(
        seq_len=options.seq_len,
        vocab_size=options.vocab,
        batch_size=options.batch,
        seed=context.seed,
        eval_sequences=options.eval_sequences,
    )
    model, name = build_token_model(
        context, vocab_size=options.vocab, seq_len=options.seq_len - 1, task="duplication"
    )
    task.check_model(model)
    return TaskSetup(task=task, model=model, model_name=name, data_name=task.fingerprint())


register_task(
    "duplication",
    DuplicationOptions,
    build_duplication,
    description="the Reformer paper's 0w0w copy task (Table 2), generated from the seed",
)
