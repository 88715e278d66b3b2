"""GLUE fine-tuning (Wang et al. 2019, arXiv 1804.07461): the classification / regression task
for :func:`effiformer.train.train`, registered as ``glue-sst2``, ``glue-cola``, ``glue-rte``,
``glue-mrpc`` and ``glue-stsb``.

The readers and task specs are :mod:`effiformer.data.glue`, the metrics :mod:`effiformer.metrics`.
A fine-tuning run starts from a pretraining checkpoint (``--init``): the pretraining task rebuilds
its model (its registered ``load_model``) and the model turns itself into a classifier
(:meth:`~effiformer.models.base.EffiModel.sequence_classifier`); checkpoints record the
classifier's kind (:func:`~effiformer.models.classifier.classifier_kind`), from which
:func:`load_classifier` rebuilds it.

Fine-tuning uses its own recipe (:data:`GLUE_FINETUNE_RECIPE`, the project's default for it), not
the pretraining recipe of the model's family.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..checkpoint import (
    META,
    CheckpointError,
    load_checkpoint,
    load_config,
    load_model,
    load_weights,
    read_train_config,
    resolve_checkpoint,
    run_dir_of,
    verify_checkpoint,
)
from ..data.glue import GLUE_TASKS, GlueExample, glue_spec, read_glue
from ..data.tokenizer import SubwordTokenizer
from ..metrics import glue_metrics
from ..models.base import ModelOutput
from ..models.classifier import build_classifier, classifier_kind
from ..progress import status, track
from ..recipes import TrainRecipe
from .base import Batch, rank_rows, resolve_device
from .registry import (
    BuildContext,
    EvalReport,
    TaskSetup,
    get_task,
    make_options,
    register_task,
    task_option,
)

__all__ = [
    "GLUE_FINETUNE_RECIPE",
    "GlueEvalOptions",
    "GlueOptions",
    "GlueTask",
    "build_glue",
    "evaluate_glue",
    "load_classifier",
    "load_pretrained",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

#: Fine-tuning recipe: the project's default (the former ``python -m effiformer.tasks.glue
#: finetune`` defaults): AdamW lr 1e-4, betas (0.9, 0.99), weight decay 0.01 on matrices, 100
#: warmup steps, cosine to 0.1 of the peak, clip 1.0.
GLUE_FINETUNE_RECIPE = TrainRecipe(
    name="glue-finetune",
    source="project default for GLUE fine-tuning",
    optimizer="adamw",
    lr=1e-4,
    betas=(0.9, 0.99),
    eps=1e-8,
    weight_decay=0.01,
    no_decay="1d",
    warmup=100,
    schedule="cosine",
    min_lr_ratio=0.1,
    clip=1.0,
)


def _accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


class GlueTask:
    """Fine-tuning and evaluation on one GLUE task, for :func:`effiformer.train.train`.

    ``task``: ``sst2 | cola | rte | mrpc | stsb``; ``data_dir``: the task's folder; ``tokenizer``:
    the pretraining tokenizer. Training batches: ``batch_size`` examples in a fresh shuffled
    order each epoch (deterministic from ``(seed, epoch)``; the last partial batch of an epoch is
    dropped), encoded as ``[CLS] a [SEP] (b [SEP])`` truncated to ``max_len`` and padded to the
    longest row. Labels: int class ids (cross-entropy) or float scores (STS-B, MSE). Evaluation
    splits: ``valid``/``dev`` (the dev set), ``train``, and ``test`` where labels exist (MRPC).
    ``max_train_examples``: train on only the first N examples (None: all).
    """

    def __init__(
        self,
        task: str,
        data_dir: PathLike,
        tokenizer: SubwordTokenizer,
        *,
        max_len: int = 128,
        batch_size: int = 32,
        seed: int = 0,
        eval_batch_size: int = 64,
        max_train_examples: int | None = None,
    ) -> None:
        self.spec = glue_spec(task)
        if not isinstance(tokenizer, SubwordTokenizer):
            raise TypeError(f"tokenizer must be a SubwordTokenizer, got {type(tokenizer).__name__}")
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.data_dir = Path(data_dir)
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.batch_size = batch_size
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        self.max_train_examples = max_train_examples
        self.metric_name = self.spec.metric_name
        self._examples: dict[str, list[GlueExample]] = {}
        train = self.examples("train")
        if max_train_examples is not None:
            train = train[:max_train_examples]
            self._examples["train"] = train
        if len(train) < batch_size:
            raise ValueError(
                f"GLUE {self.spec.name} has {len(train)} training examples, fewer than "
                f"batch_size={batch_size}"
            )
        h = hashlib.sha256(tokenizer._tok.to_str().encode())
        for ex in train:
            h.update(f"{ex.text_a}\t{ex.text_b}\t{ex.label}\n".encode())
        self.fingerprint = h.hexdigest()[:16]
        self._epoch = 0
        self._position = 0
        self.head: str | None = None

    @property
    def name(self) -> str:
        return f"glue-{self.spec.name}"

    def examples(self, split: str) -> list[GlueExample]:
        split = "dev" if split == "valid" else split
        if split not in self._examples:
            with status(f"reading GLUE {self.spec.name} {split} from {self.data_dir}", logger):
                self._examples[split] = read_glue(self.spec.name, self.data_dir, split)
        return self._examples[split]

    def encode(self, examples: Sequence[GlueExample]) -> Batch:
        """``input_ids``, ``token_type_ids``, ``attention_mask`` (B, T) and ``labels`` (B,)."""
        enc = self.tokenizer.encode(
            [ex.text_a for ex in examples],
            None if not self.spec.pair else [ex.text_b or "" for ex in examples],
            max_len=self.max_len,
            padding="longest",
        )
        dtype = torch.float32 if self.spec.kind == "regression" else torch.int64
        labels = torch.tensor([ex.label for ex in examples], dtype=dtype)  # (B,)
        return Batch(
            {
                "input_ids": enc.input_ids,
                "token_type_ids": enc.token_type_ids,
                "attention_mask": enc.attention_mask,
                "labels": labels,
            }
        )

    def _permutation(self, epoch: int) -> Tensor:
        digest = hashlib.sha256(f"glue:{self.spec.name}:{self.seed}:{epoch}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return torch.randperm(len(self.examples("train")), generator=gen)

    def check_model(self, model: nn.Module) -> None:
        n_labels = getattr(model, "n_labels", None)
        if n_labels is not None and n_labels != self.spec.num_labels:
            raise ValueError(
                f"GLUE {self.spec.name} needs {self.spec.num_labels} output(s), the model has "
                f"n_labels={n_labels}"
            )
        config = getattr(model, "config", None)
        if config is not None and config.vocab_size < self.tokenizer.vocab_size:
            raise ValueError(
                f"the tokenizer has {self.tokenizer.vocab_size} ids but the model's vocab_size is "
                f"{config.vocab_size}"
            )
        if config is not None and self.max_len > config.seq_len:
            raise ValueError(f"max_len={self.max_len} exceeds the model's seq_len={config.seq_len}")

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        self.check_model(model)
        self.head = classifier_kind(model)  # recorded in checkpoints for load_classifier
        lo, rows = rank_rows(self.batch_size, rank, world)
        train = self.examples("train")
        per_epoch = len(train) // self.batch_size

        def _iterate() -> Iterator[Batch]:
            while True:
                perm = self._permutation(self._epoch)
                while self._position < per_epoch:
                    i = self._position * self.batch_size
                    idx = perm[i : i + self.batch_size].tolist()
                    self._position += 1
                    batch = self.encode([train[j] for j in idx])  # the global batch
                    yield Batch({k: v[lo : lo + rows] for k, v in batch.data.items()})
                self._epoch, self._position = self._epoch + 1, 0

        return _iterate()

    def forward(self, model: nn.Module, batch: Batch, state: Any = None) -> ModelOutput:
        d = batch.data
        kwargs = {"labels": d["labels"], "attention_mask": d["attention_mask"]}
        if _accepts(model, "token_type_ids"):
            kwargs["token_type_ids"] = d["token_type_ids"]
        return model(d["input_ids"], **kwargs)

    @torch.no_grad()
    def predict(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """``(predictions, targets, mean loss)`` over ``split``: class ids, or scores (STS-B)."""
        examples = self.examples(split)
        was_training = model.training
        model.eval()
        preds, total = [], 0.0
        try:
            starts = range(0, len(examples), self.eval_batch_size)
            for i in track(starts, desc=f"eval {self.name} {split}", unit="batch"):
                batch = self.encode(examples[i : i + self.eval_batch_size]).to(device)
                with autocast if autocast is not None else contextlib.nullcontext():
                    out = self.forward(model, batch)
                logits = out.logits.float()
                total += float(out.loss.double()) * batch.rows
                if self.spec.kind == "regression":
                    preds.append(logits.squeeze(-1).cpu().numpy())
                else:
                    preds.append(logits.argmax(-1).cpu().numpy())
        finally:
            model.train(was_training)
        target = np.array([ex.label for ex in examples])
        return np.concatenate(preds), target, total / len(examples)

    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """Every metric of the task (headline first), ``loss`` and ``examples`` over ``split``."""
        pred, target, loss = self.predict(model, split, device=device, autocast=autocast)
        return {**glue_metrics(self.spec.name, pred, target), "loss": loss, "examples": len(target)}

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"the saved data position is for GLUE data with fingerprint "
                f"{state.get('fingerprint')!r}, this task's is {self.fingerprint!r}; resume on "
                "the same task, data and tokenizer"
            )
        self._epoch, self._position = int(state["epoch"]), int(state["position"])

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "data": str(self.data_dir.resolve()),
            "fingerprint": self.fingerprint,
            "metric": self.metric_name,
            "n_labels": self.spec.num_labels,
            "max_len": self.max_len,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "eval_batch_size": self.eval_batch_size,
            "max_train_examples": self.max_train_examples,
            "vocab_size": self.tokenizer.vocab_size,
            "head": self.head,
        }

    def artifacts(self) -> dict[str, bytes]:
        return {"tokenizer.json": self.tokenizer._tok.to_str(pretty=False).encode("utf-8")}

    def __repr__(self) -> str:
        return (
            f"GlueTask({self.spec.name!r}, data={str(self.data_dir)!r}, batch_size="
            f"{self.batch_size}, max_len={self.max_len}, seed={self.seed})"
        )


# --------------------------------------------------------------------------------------------
# Checkpoints: the pretrained model a run starts from, the fine-tuned classifier it writes
# --------------------------------------------------------------------------------------------


def load_pretrained(directory: PathLike) -> nn.Module:
    """The pretrained model of a run or checkpoint directory: rebuilt by the task that trained
    it (``get_task(name).load_model``; ELECTRA rebuilds generator + discriminator), or by
    :func:`effiformer.load_model` for a plain saved model (no ``meta.json``)."""
    d = resolve_checkpoint(directory)
    if not (d / META).is_file():
        return load_model(d)
    meta = verify_checkpoint(d)
    task_name = (meta.get("task") or {}).get("task") or "lm"
    spec = get_task(task_name)
    if spec.load_model is None:
        return load_checkpoint(d)[0]
    saved = read_train_config(d).get("task_options") or {}
    return spec.load_model(d, make_options(spec.options, saved, owner=f"--task {task_name}"))


def load_classifier(directory: PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """The fine-tuned classifier of a GLUE training checkpoint (run or checkpoint directory)
    and the checkpoint's meta (``meta["task"]`` is :meth:`GlueTask.describe`)."""
    d = resolve_checkpoint(directory)
    meta = verify_checkpoint(d)
    task = meta.get("task") or {}
    if str(task.get("task", "")) not in _GLUE_NAMES:
        raise CheckpointError(f"{d} is not a GLUE fine-tuning checkpoint (task {task.get('task')})")
    kind = task.get("head")
    try:
        model = build_classifier(str(kind), load_config(d), int(task["n_labels"]))
    except KeyError as e:
        raise CheckpointError(f"{d}: {e.args[0] if e.args else e} (in {META})") from None
    load_weights(model, d)
    meta["path"] = str(d)
    return model, meta


# --------------------------------------------------------------------------------------------
# Registration: glue-<task> for every task of data.glue.GLUE_TASKS
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GlueOptions:
    """Options of the ``glue-*`` tasks: fine-tune the pretraining run ``init`` on the task folder
    ``data``."""

    init: str = task_option(help="pretraining run or checkpoint to fine-tune", metavar="RUN")
    data: str = task_option(help="the GLUE task's folder, e.g. .../glue/SST-2", metavar="FOLDER")
    batch: int = task_option(32, "examples per step")
    max_len: int = task_option(128, "max tokens per example")

    def __post_init__(self) -> None:
        for name in ("batch", "max_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")


@dataclass(frozen=True, kw_only=True)
class GlueEvalOptions:
    """Options of ``effiformer eval`` for a GLUE fine-tuning checkpoint."""

    data: str | None = task_option(
        None, "the task's folder (default: the one recorded at training)", metavar="PATH"
    )


def build_glue(task: str, options: GlueOptions, context: BuildContext) -> TaskSetup:
    """GLUE ``task`` (``sst2``, ...): the tokenizer and pretrained model of ``options.init``, the
    model's :meth:`sequence_classifier`, the :class:`GlueTask`; a resumed run rebuilds the
    classifier recorded in its checkpoint."""
    if context.model_name is not None and context.resume is None:
        raise ValueError(
            f"--task glue-{task} takes its architecture from --init; do not give a model NAME"
        )
    if context.overrides:
        raise ValueError("--task glue-* takes its architecture from --init; --set is not allowed")
    init = resolve_checkpoint(options.init)
    tokenizer = SubwordTokenizer.load(context.resume if context.resume is not None else init)
    glue = GlueTask(
        task,
        options.data,
        tokenizer,
        max_len=options.max_len,
        batch_size=options.batch,
        seed=context.seed,
    )
    torch.manual_seed(context.seed)
    n_labels = glue.spec.num_labels
    if context.resume is not None:
        kind = (verify_checkpoint(context.resume).get("task") or {}).get("head")
        model = build_classifier(str(kind), load_config(context.resume), n_labels)
        name = context.model_name or f"{glue.name}-from-{run_dir_of(init).name}"
    else:
        pretrained = load_pretrained(init)
        sequence_classifier = getattr(pretrained, "sequence_classifier", None)
        if sequence_classifier is None:
            raise ValueError(f"{type(pretrained).__name__} cannot become a sequence classifier")
        model = sequence_classifier(n_labels)
        name = f"{glue.name}-from-{run_dir_of(init).name}"
    return TaskSetup(
        task=glue,
        model=model,
        model_name=name,
        data_name=Path(options.data).name,
        recipe=GLUE_FINETUNE_RECIPE,
    )


def evaluate_glue(
    checkpoint: Path,
    meta: dict[str, Any],
    options: GlueEvalOptions,
    *,
    split: str = "valid",
    device: str = "cpu",
) -> EvalReport:
    """Every metric of a fine-tuned GLUE checkpoint on ``split`` (``valid``/``dev``, ``train``,
    ``test`` where labelled) of its task folder (or ``options.data``)."""
    model, meta = load_classifier(checkpoint)
    saved = meta["task"]
    glue = GlueTask(
        saved["task"].removeprefix("glue-"),
        options.data or saved["data"],
        SubwordTokenizer.load(meta["path"]),
        max_len=saved["max_len"],
        batch_size=1,
        eval_batch_size=saved["eval_batch_size"],
    )
    split = {"valid": "dev"}.get(split, split)
    dev = resolve_device(device)
    result = glue.evaluate(model.to(dev), split, device=dev)
    record = {
        "checkpoint": meta["path"],
        "task": glue.name,
        "split": split,
        "step": meta.get("step"),
        **result,
    }
    scores = ", ".join(
        f"{m} {100 * result[m]:.1f}" if m in ("accuracy", "f1") else f"{m} {result[m]:.3f}"
        for m in glue.spec.metrics
        if m in result
    )
    summary = (
        f"{glue.name} {split} (step {meta.get('step')}): {scores} on {result['examples']:,} "
        f"examples; loss {result['loss']:.4f}"
    )
    return EvalReport(record=record, summary=summary)


def _register(task: str) -> None:
    def build(options: GlueOptions, context: BuildContext) -> TaskSetup:
        return build_glue(task, options, context)

    spec = GLUE_TASKS[task]
    register_task(
        f"glue-{task}",
        GlueOptions,
        build,
        description=f"fine-tune the pretraining run --init on GLUE {task} ({spec.metric_name})",
        eval_options=GlueEvalOptions,
        evaluate=evaluate_glue,
    )


_GLUE_NAMES = tuple(f"glue-{t}" for t in GLUE_TASKS)
for _task in GLUE_TASKS:
    _register(_task)
