"""ListOps (Nangia and Bowman 2018, arXiv 1804.06028), as the Long Range Arena uses it (Tay et al.
2021, arXiv 2011.04006, sec. 3.1): nested prefix expressions over the digits 0-9 with the
operators ``MAX``, ``MIN``, ``MED`` (median, truncated to an integer) and ``SM`` (sum modulo 10);
the label is the expression's value, 10 classes. Example (17 tokens, label 5)::

    [MAX 2 9 [MIN 4 7 ] 0 ]  -> 9        [SM 1 [MED 3 8 6 ] 2 [MIN 4 9 ] ] -> (1 + 6 + 2 + 4) % 10 = 3

Generator (LRA's ``listops.py`` recipe, written here from its description): below the root, a
node is an operator with probability 0.25 (else a uniform digit), an operator takes 2 to
``max_args`` arguments, nodes at ``max_depth`` are digits; the root is always an operator.
Expressions whose length in tokens falls outside ``[min_len, max_len]`` are drawn again (LRA:
500 to 2,000 tokens, depth 10, 10 arguments; the CPU budget of the quality suite uses shorter
ones, see ``docs/quality.md``).

Tokens: every bracket is a token (LRA's own tokenizer drops them, its issue #20); an opening
bracket is written together with its operator (``[MAX``), as in the original data, so the
vocabulary is ``<pad> <cls> 0..9 [MAX [MIN [MED [SM ]`` (17 ids). The model reads ``<cls>`` and
then the expression, padded to ``max_len + 1`` with ``<pad>`` (``attention_mask`` 0 there);
lengths are counted in expression tokens, without ``<cls>``.

The label comes from the tree the generator built; :func:`evaluate_expression` is an
independent evaluator of the printed tokens (a stack machine) that the tests compare with it.
"""

from __future__ import annotations

import contextlib
import random
import statistics
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..models.base import ModelOutput
from .base import Batch
from .registry import BuildContext, TaskSetup, register_task, task_option
from .synthetic import SeededBatches, check_int, derive_seed

__all__ = [
    "LISTOPS_VOCAB",
    "ListOpsOptions",
    "ListOpsTask",
    "build_listops",
    "build_listops_model",
    "evaluate_expression",
    "generate_expression",
    "listops_batch",
]

PAD, CLS = 0, 1
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
LISTOPS_VOCAB: tuple[str, ...] = ("<pad>", "<cls>", *map(str, range(10)), *OPERATORS, END)
_ID = {t: i for i, t in enumerate(LISTOPS_VOCAB)}
OPERATOR_P = 0.25  # LRA: a node is a value with probability 0.75


def _apply(op: str, args: Sequence[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        return int(statistics.median(args))
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


class _TooLong(Exception):
    """A draw that already exceeds ``max_len`` tokens (it would be rejected anyway)."""


def _tree(
    rng: random.Random, depth: int, max_depth: int, max_args: int, root: bool, budget: list[int]
) -> Any:
    """A digit or ``(op, [children])``; ``budget[0]`` counts the tokens left before the draw is
    too long (raising :class:`_TooLong` early saves building trees that would be redrawn)."""
    if not root and (depth >= max_depth or rng.random() >= OPERATOR_P):
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLong
        return rng.randrange(10)
    op = rng.choice(OPERATORS)
    n = rng.randint(2, max_args)
    budget[0] -= 2  # the operator and its closing bracket
    if budget[0] < 0:
        raise _TooLong
    return (op, [_tree(rng, depth + 1, max_depth, max_args, False, budget) for _ in range(n)])


def _flatten(tree: Any, out: list[str]) -> int:
    """Append ``tree``'s tokens to ``out``; return its value."""
    if isinstance(tree, int):
        out.append(str(tree))
        return tree
    op, children = tree
    out.append(op)
    values = [_flatten(c, out) for c in children]
    out.append(END)
    return _apply(op, values)


def generate_expression(
    rng: random.Random, *, min_len: int, max_len: int, max_depth: int = 10, max_args: int = 10
) -> tuple[list[str], int]:
    """One expression of ``min_len`` to ``max_len`` tokens and its value (redrawn until its
    length fits; at most 100,000 draws)."""
    for _ in range(100_000):
        tokens: list[str] = []
        try:
            tree = _tree(rng, 1, max_depth, max_args, True, [max_len])
        except _TooLong:
            continue
        value = _flatten(tree, tokens)
        if min_len <= len(tokens) <= max_len:
            return tokens, value
    raise ValueError(
        f"no ListOps expression of {min_len} to {max_len} tokens in 100,000 draws (max_depth="
        f"{max_depth}, max_args={max_args}); widen the length range"
    )


def evaluate_expression(tokens: Sequence[str]) -> int:
    """The value of a printed ListOps expression (a stack machine over its tokens, independent
    of the generator's tree)."""
    stack: list[list[Any]] = []
    result: int | None = None
    for tok in tokens:
        if tok in OPERATORS:
            stack.append([tok])
        elif tok == END:
            if not stack:
                raise ValueError("unbalanced ']' in ListOps expression")
            frame = stack.pop()
            value = _apply(frame[0], frame[1:])
            if stack:
                stack[-1].append(value)
            else:
                result = value
        elif tok.isdigit() and len(tok) == 1:
            if not stack:
                raise ValueError("a digit outside any operator")
            stack[-1].append(int(tok))
        else:
            raise ValueError(f"unknown ListOps token {tok!r}")
    if stack or result is None:
        raise ValueError("unbalanced ListOps expression")
    return result


def listops_batch(
    rows: int,
    rng: random.Random,
    *,
    min_len: int,
    max_len: int,
    max_depth: int = 10,
    max_args: int = 10,
) -> tuple[Tensor, Tensor, Tensor]:
    """``rows`` expressions as ``(input_ids (rows, max_len + 1), attention_mask (same), labels
    (rows,))``: ``<cls>`` first, ``<pad>`` after the expression."""
    ids = torch.full((rows, max_len + 1), PAD, dtype=torch.long)
    mask = torch.zeros((rows, max_len + 1), dtype=torch.long)
    labels = torch.empty(rows, dtype=torch.long)
    for r in range(rows):
        tokens, value = generate_expression(
            rng, min_len=min_len, max_len=max_len, max_depth=max_depth, max_args=max_args
        )
        n = len(tokens) + 1
        ids[r, :n] = torch.tensor([CLS] + [_ID[t] for t in tokens])
        mask[r, :n] = 1
        labels[r] = value
    return ids, mask, labels


def decode(ids: Tensor) -> list[str]:
    """The expression tokens of one row of ``input_ids`` (``<cls>`` and padding dropped)."""
    return [LISTOPS_VOCAB[i] for i in ids.tolist() if i not in (PAD, CLS)]


class ListOpsTask(SeededBatches):
    """ListOps classification (see the module docstring) for a bidirectional encoder that takes
    ``(input_ids, labels=, attention_mask=)`` and returns ``(B, 10)`` logits (a
    :class:`~effiformer.models.classifier.SequenceClassifier` or the Funnel classifier).

    ``max_len`` / ``min_len``: expression length in tokens; ``max_depth`` / ``max_args``: the
    generator's limits; ``batch_size``: rows of the global batch; ``seed``: the data seed
    (training batch ``i`` from ``(seed, i)``, the evaluation sets from fixed seeds);
    ``eval_sequences`` / ``eval_batch_size``: the fixed evaluation sets.
    """

    metric_name = "accuracy"
    n_labels = 10
    vocab_size = len(LISTOPS_VOCAB)
    name = "listops"

    def __init__(
        self,
        *,
        max_len: int = 256,
        min_len: int | None = None,
        max_depth: int = 10,
        max_args: int = 10,
        batch_size: int = 32,
        seed: int = 0,
        eval_sequences: int = 1000,
        eval_batch_size: int = 50,
    ) -> None:
        self.max_len = check_int("max_len", max_len, 4)
        self.min_len = max_len // 2 if min_len is None else check_int("min_len", min_len, 4)
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        self.max_depth = check_int("max_depth", max_depth, 1)
        self.max_args = check_int("max_args", max_args, 2)
        self.batch_size = check_int("batch_size", batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.eval_sequences = check_int("eval_sequences", eval_sequences)
        self.eval_batch_size = check_int("eval_batch_size", eval_batch_size)
        self.model_len = self.max_len + 1
        self._step = 0
        self._pending: int | None = None
        self._splits: dict[str, tuple[Tensor, Tensor, Tensor]] = {}

    def _gen(self, rows: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        return listops_batch(
            rows,
            random.Random(seed),
            min_len=self.min_len,
            max_len=self.max_len,
            max_depth=self.max_depth,
            max_args=self.max_args,
        )

    def check_model(self, model: nn.Module) -> None:
        config = getattr(model, "config", None)
        if config is None:
            return
        if getattr(config, "causal", False):
            raise ValueError("ListOps classification needs a bidirectional encoder (causal=False)")
        if config.vocab_size < self.vocab_size:
            raise ValueError(
                f"ListOps uses {self.vocab_size} token ids but the model's vocab_size is "
                f"{config.vocab_size}; build it with vocab_size={self.vocab_size}"
            )
        if config.seq_len < self.model_len:
            raise ValueError(
                f"the model reads {self.model_len} tokens (<cls> and up to {self.max_len}) but its "
                f"seq_len is {config.seq_len}; build it with seq_len >= {self.model_len}"
            )

    def fingerprint(self) -> str:
        return (
            f"listops:L{self.min_len}-{self.max_len}:D{self.max_depth}:A{self.max_args}:"
            f"B{self.batch_size}:S{self.seed}"
        )

    def batch(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        return self._gen(self.batch_size, derive_seed(self.seed, step))

    def batch_data(self, step: int) -> dict[str, Tensor]:
        x, m, y = self.batch(step)
        return {"input_ids": x, "attention_mask": m, "labels": y}

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput:
        d = batch.data
        return model(d["input_ids"], labels=d["labels"], attention_mask=d["attention_mask"])

    def split(self, split: str) -> tuple[Tensor, Tensor, Tensor]:
        offsets = {"valid": 1, "test": 2, "train": 3}
        if split not in offsets:
            raise ValueError(f"split must be one of {sorted(offsets)}, got {split!r}")
        if split not in self._splits:
            self._splits[split] = self._gen(
                self.eval_sequences, derive_seed(self.seed, -offsets[split])
            )
        return self._splits[split]

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """``{"accuracy", "loss", "majority_accuracy" (the most frequent label of the split),
        "sequences"}``."""
        self.check_model(model)
        xs, ms, ys = self.split(split)
        was = model.training
        model.eval()
        dev = torch.device(device)
        nll, correct = 0.0, 0
        try:
            with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
                torch.manual_seed(0)
                for s in range(0, xs.shape[0], self.eval_batch_size):
                    sl = slice(s, s + self.eval_batch_size)
                    b = Batch({"input_ids": xs[sl], "attention_mask": ms[sl], "labels": ys[sl]})
                    with autocast if autocast is not None else contextlib.nullcontext():
                        out = self.forward(model, b.to(dev), None)
                    n = b.rows
                    nll += float(out.loss.double()) * n
                    correct += int((out.logits.argmax(-1).cpu() == ys[sl]).sum())
        finally:
            model.train(was)
        counts = torch.bincount(ys, minlength=self.n_labels)
        return {
            "accuracy": correct / xs.shape[0],
            "loss": nll / xs.shape[0],
            "majority_accuracy": float(counts.max()) / xs.shape[0],
            "sequences": xs.shape[0],
        }

    def describe(self) -> dict[str, Any]:
        return {
            "task": "listops",
            "max_len": self.max_len,
            "min_len": self.min_len,
            "max_depth": self.max_depth,
            "max_args": self.max_args,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "eval_sequences": self.eval_sequences,
            "metric": self.metric_name,
            "n_labels": self.n_labels,
        }

    def artifacts(self) -> dict[str, bytes]:
        return {}


def build_listops_model(config: Any) -> nn.Module:
    """The ListOps classifier of a model config (``causal=False``): the Funnel family's own
    encoder-only classifier, else :class:`~effiformer.models.classifier.SequenceClassifier` on
    the model (``hidden[:, 0]``, the ``<cls>`` position)."""
    from ..models.classifier import build_classifier

    kind = "funnel" if config.family == "funnel" else "encoder"
    return build_classifier(kind, config, ListOpsTask.n_labels)


@dataclass(frozen=True, kw_only=True)
class ListOpsOptions:
    """``effiformer train NAME --task listops`` options."""

    max_len: int = task_option(256, "longest expression in tokens (the model reads max_len + 1)")
    min_len: int | None = task_option(None, "shortest expression in tokens (default: max_len / 2)")
    max_depth: int = task_option(10, "deepest nesting")
    max_args: int = task_option(10, "most arguments of an operator")
    batch: int = task_option(32, "expressions per global batch")
    eval_sequences: int = task_option(1000, "expressions in each evaluation set")

    def __post_init__(self) -> None:
        ListOpsTask(
            max_len=self.max_len,
            min_len=self.min_len,
            max_depth=self.max_depth,
            max_args=self.max_args,
            batch_size=self.batch,
            eval_sequences=self.eval_sequences,
        )


def build_listops(options: ListOpsOptions, context: BuildContext) -> TaskSetup:
    """The ``listops`` task: the registered NAME as a bidirectional encoder (``causal=False``,
    vocabulary and length set for the task) under a 10-class head, and the :class:`ListOpsTask`."""
    from ..checkpoint import load_config
    from ..config import parse_overrides, replace_config
    from ..registry import get_spec

    task = ListOpsTask(
        max_len=options.max_len,
        min_len=options.min_len,
        max_depth=options.max_depth,
        max_args=options.max_args,
        batch_size=options.batch,
        seed=context.seed,
        eval_sequences=options.eval_sequences,
    )
    if context.resume is not None:
        config = load_config(context.resume)
        name = context.model_name or "resumed"
    else:
        if context.model_name is None:
            raise ValueError("give a registered model NAME for the listops task")
        name = context.model_name
        base = get_spec(name).config
        overrides = parse_overrides(base, list(context.overrides))
        if overrides.get("causal", False):
            raise ValueError("ListOps needs a bidirectional encoder; drop --set causal=true")
        overrides["causal"] = False
        overrides.setdefault("vocab_size", task.vocab_size)
        overrides.setdefault("seq_len", task.model_len)
        config = replace_config(base, **overrides)
    torch.manual_seed(context.seed)
    model = build_listops_model(config)
    task.check_model(model)
    return TaskSetup(task=task, model=model, model_name=name, data_name=task.fingerprint())


register_task(
    "listops",
    ListOpsOptions,
    build_listops,
    description="ListOps classification (Nangia and Bowman 2018, as LRA), generated from the seed",
)
