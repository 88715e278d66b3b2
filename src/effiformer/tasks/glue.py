"""GLUE (Wang et al. 2019, arXiv 1804.07461): readers for the raw task files, the official
metrics, and a classification/regression task for :func:`effiformer.train.train`.

==========  ==========================================  ======  ==========================
task        files (train / dev)                         labels  metrics (headline first)
==========  ==========================================  ======  ==========================
``sst2``    ``train.tsv`` / ``dev.tsv`` (header)        0/1     accuracy
``cola``    ``in_domain_train.tsv`` / ``in_domain_dev.tsv``  0/1  mcc (Matthews), accuracy
            (raw CoLA 1.1: no header, 4 columns)
``rte``     ``train.tsv`` / ``dev.tsv`` (header)        0/1     accuracy
``mrpc``    ``msr_paraphrase_train.txt`` (raw MSR)      0/1     f1 (class 1), accuracy
``stsb``    ``train.tsv`` / ``dev.tsv`` (header)        0-5     pearson, spearman
==========  ==========================================  ======  ==========================

Files are read as UTF-8 (a BOM is skipped), split on ``"\\n"`` only, with quoting disabled
(tab-separated, quotes are text). Columns of header files are found by name, so both the HF
layout (``sentence1 sentence2 label idx``) and the GLUE-zip layout (``index sentence1 sentence2
label``, labels ``entailment``/``not_entailment``) of RTE read the same.

MRPC: GLUE's dev split is a list of 408 train pairs that is not shipped here. The dev split used
instead is fixed and documented (docs/glue.md): the 408 pairs of ``msr_paraphrase_train.txt``
with the smallest ``sha256("<#1 ID>-<#2 ID>")``; train is the other 3,668 pairs, in file order;
``test`` is ``msr_paraphrase_test.txt`` (GLUE's test set, labelled here).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from ..data.tokenizer import SubwordTokenizer
from ..layers import prefix_keys
from ..layers.heads import SequenceClassificationHead, sequence_classification_loss
from ..models.base import EffiModel, ModelOutput
from . import Batch, rank_rows

__all__ = [
    "GLUE_TASKS",
    "GlueTask",
    "SequenceClassifier",
    "classifier_from_pretrained",
    "load_classifier",
    "GlueError",
    "GlueExample",
    "GlueSpec",
    "MRPC_DEV_SIZE",
    "accuracy",
    "f1_score",
    "glue_metrics",
    "matthews_corrcoef",
    "pearson",
    "read_glue",
    "spearman",
]

PathLike = str | os.PathLike[str]
MRPC_DEV_SIZE = 408


class GlueError(ValueError):
    """A missing or malformed GLUE file; the message names the file (and line)."""


@dataclass(frozen=True)
class GlueExample:
    """One example: ``text_b`` is ``None`` for single-sentence tasks; ``label`` is an int class
    id (classification) or a float score (STS-B). ``line`` is its 1-based line in ``source``."""

    text_a: str
    text_b: str | None
    label: int | float
    line: int = 0


@dataclass(frozen=True)
class GlueSpec:
    """What a task is: its files per split, whether it is a pair task, its label set."""

    name: str
    files: dict[str, str]
    pair: bool
    kind: Literal["classification", "regression"]
    num_labels: int  # 1 for regression
    metrics: tuple[str, ...]  # headline first

    @property
    def metric_name(self) -> str:
        return self.metrics[0]


GLUE_TASKS: dict[str, GlueSpec] = {
    "sst2": GlueSpec(
        name="sst2",
        files={"train": "train.tsv", "dev": "dev.tsv"},
        pair=False,
        kind="classification",
        num_labels=2,
        metrics=("accuracy",),
    ),
    "cola": GlueSpec(
        name="cola",
        files={"train": "in_domain_train.tsv", "dev": "in_domain_dev.tsv"},
        pair=False,
        kind="classification",
        num_labels=2,
        metrics=("mcc", "accuracy"),
    ),
    "rte": GlueSpec(
        name="rte",
        files={"train": "train.tsv", "dev": "dev.tsv"},
        pair=True,
        kind="classification",
        num_labels=2,
        metrics=("accuracy",),
    ),
    "mrpc": GlueSpec(
        name="mrpc",
        files={
            "train": "msr_paraphrase_train.txt",
            "dev": "msr_paraphrase_train.txt",
            "test": "msr_paraphrase_test.txt",
        },
        pair=True,
        kind="classification",
        num_labels=2,
        metrics=("f1", "accuracy"),
    ),
    "stsb": GlueSpec(
        name="stsb",
        files={"train": "train.tsv", "dev": "dev.tsv"},
        pair=True,
        kind="regression",
        num_labels=1,
        metrics=("pearson", "spearman"),
    ),
}


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------


def _spec(task: str) -> GlueSpec:
    name = task.lower().replace("-", "").replace("_", "")
    if name not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[name]


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """``(line number, fields)`` of every non-empty line; tab-separated, no quoting."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GlueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GlueError(f"{path}: is a directory, expected a TSV file") from None
    except OSError as e:
        raise GlueError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise GlueError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from None
    out = []
    for i, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if line:
            out.append((i, line.split("\t")))
    if not out:
        raise GlueError(f"{path}: the file is empty")
    return out


def _columns(path: Path, header: list[str], wanted: Sequence[str]) -> list[int]:
    missing = [c for c in wanted if c not in header]
    if missing:
        raise GlueError(
            f"{path}:1: header {header} lacks the column(s) {missing}; expected a header with "
            f"{list(wanted)}"
        )
    return [header.index(c) for c in wanted]


def _check_width(path: Path, line: int, fields: list[str], width: int) -> None:
    if len(fields) != width:
        raise GlueError(
            f"{path}:{line}: expected {width} tab-separated columns, got {len(fields)} "
            f"(quoting is disabled; a stray tab or a truncated line?)"
        )


def _class_label(path: Path, line: int, value: str, names: dict[str, int]) -> int:
    if value not in names:
        raise GlueError(
            f"{path}:{line}: label {value!r} is not one of the task's labels {sorted(set(names))}"
        )
    return names[value]


_BINARY = {"0": 0, "1": 1}


def _read_header_file(
    path: Path, text_cols: Sequence[str], label_col: str, parse: Callable[[int, str], float | int]
) -> list[GlueExample]:
    rows = _rows(path)
    header = rows[0][1]
    idx = _columns(path, header, [*text_cols, label_col])
    out = []
    for line, fields in rows[1:]:
        _check_width(path, line, fields, len(header))
        texts = [fields[i] for i in idx[:-1]]
        out.append(
            GlueExample(
                text_a=texts[0],
                text_b=texts[1] if len(texts) > 1 else None,
                label=parse(line, fields[idx[-1]]),
                line=line,
            )
        )
    if not out:
        raise GlueError(f"{path}: has a header but no examples")
    return out


def _read_sst2(path: Path) -> list[GlueExample]:
    return _read_header_file(
        path, ["sentence"], "label", lambda n, v: _class_label(path, n, v, _BINARY)
    )


_RTE_LABELS = {"0": 0, "1": 1, "entailment": 0, "not_entailment": 1}


def _read_rte(path: Path) -> list[GlueExample]:
    return _read_header_file(
        path,
        ["sentence1", "sentence2"],
        "label",
        lambda n, v: _class_label(path, n, v, _RTE_LABELS),
    )


def _read_stsb(path: Path) -> list[GlueExample]:
    def parse(line: int, value: str) -> float:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not 0.0 <= score <= 5.0:  # also rejects nan
            raise GlueError(f"{path}:{line}: score {value!r} is not a number in [0, 5]")
        return score

    return _read_header_file(path, ["sentence1", "sentence2"], "score", parse)


def _read_cola(path: Path) -> list[GlueExample]:
    """Raw CoLA 1.1: no header; ``source<TAB>label<TAB>original mark<TAB>sentence``."""
    rows = _rows(path)
    first = rows[0][1]
    if len(first) == 4 and first[1] not in _BINARY:
        raise GlueError(
            f"{path}:1: expected the raw CoLA layout without a header "
            f"(source, label 0/1, mark, sentence), got {first}"
        )
    out = []
    for line, fields in rows:
        _check_width(path, line, fields, 4)
        label = _class_label(path, line, fields[1], _BINARY)
        out.append(GlueExample(text_a=fields[3], text_b=None, label=label, line=line))
    return out


_MRPC_HEADER = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]


def _read_mrpc_file(path: Path) -> list[tuple[str, GlueExample]]:
    """``(pair key, example)`` for each row of a raw MSR paraphrase file."""
    rows = _rows(path)
    header = rows[0][1]
    if header != _MRPC_HEADER:
        raise GlueError(f"{path}:1: expected the MSR header {_MRPC_HEADER}, got {header}")
    out = []
    for line, fields in rows[1:]:
        _check_width(path, line, fields, 5)
        label = _class_label(path, line, fields[0], _BINARY)
        key = f"{fields[1]}-{fields[2]}"
        out.append((key, GlueExample(text_a=fields[3], text_b=fields[4], label=label, line=line)))
    if not out:
        raise GlueError(f"{path}: has a header but no examples")
    return out


def mrpc_dev_keys(train_path: PathLike) -> frozenset[str]:
    """The fixed MRPC dev split: the ``"<#1 ID>-<#2 ID>"`` keys of the 408 train pairs with the
    smallest sha256 of that key (independent of library versions and of the file's order)."""
    path = Path(train_path)
    keys = [k for k, _ in _read_mrpc_file(path)]
    if len(keys) <= MRPC_DEV_SIZE:
        raise GlueError(
            f"{path}: {len(keys)} pairs is too few to hold out a {MRPC_DEV_SIZE}-pair dev split"
        )
    ranked = sorted(keys, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    return frozenset(ranked[:MRPC_DEV_SIZE])


def _read_mrpc(path: Path, split: str) -> list[GlueExample]:
    rows = _read_mrpc_file(path)
    if split == "test":
        return [ex for _, ex in rows]
    dev = mrpc_dev_keys(path)
    return [ex for k, ex in rows if (k in dev) == (split == "dev")]


def read_glue(task: str, data_dir: PathLike, split: str = "train") -> list[GlueExample]:
    """Examples of ``split`` (``"train"`` or ``"dev"``; MRPC also ``"test"``) of GLUE ``task``
    from its folder ``data_dir`` (e.g. ``../shared/data/glue/SST-2``), in file order."""
    spec = _spec(task)
    d = Path(data_dir)
    if not d.is_dir():
        raise GlueError(
            f"{d}: no such directory (GLUE {spec.name} expects a folder with "
            f"{sorted(set(spec.files.values()))})"
        )
    if split not in spec.files:
        raise ValueError(f"GLUE {spec.name} has the splits {list(spec.files)}, got {split!r}")
    path = d / spec.files[split]
    if not path.is_file():
        raise GlueError(
            f"{path}: no such file (the {split} split of GLUE {spec.name}; the folder holds "
            f"{sorted(p.name for p in d.iterdir())})"
        )
    if spec.name == "mrpc":
        return _read_mrpc(path, split)
    reader = {"sst2": _read_sst2, "cola": _read_cola, "rte": _read_rte, "stsb": _read_stsb}
    return reader[spec.name](path)


# --------------------------------------------------------------------------------------------
# Metrics (GLUE's: sklearn's accuracy / F1 / Matthews, scipy's Pearson / Spearman)
# --------------------------------------------------------------------------------------------


def _pair(pred: Sequence | np.ndarray, target: Sequence | np.ndarray) -> tuple[np.ndarray, ...]:
    p, t = np.asarray(pred), np.asarray(target)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(
            f"predictions and targets must be 1-D of the same length, got {p.shape} and {t.shape}"
        )
    if p.size == 0:
        raise ValueError("cannot score an empty set of predictions")
    return p, t


def accuracy(pred: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray) -> float:
    """Fraction of ``pred == target``."""
    p, t = _pair(pred, target)
    return float(np.mean(p == t))


def _confusion(p: np.ndarray, t: np.ndarray) -> tuple[int, int, int, int]:
    for name, a in (("predictions", p), ("targets", t)):
        if not np.isin(a, (0, 1)).all():
            raise ValueError(f"binary {name} must be 0 or 1, got values {np.unique(a).tolist()}")
    tp = int(np.sum((p == 1) & (t == 1)))
    tn = int(np.sum((p == 0) & (t == 0)))
    fp = int(np.sum((p == 1) & (t == 0)))
    fn = int(np.sum((p == 0) & (t == 1)))
    return tp, tn, fp, fn


def f1_score(pred: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray) -> float:
    """F1 of the positive class 1: ``2 TP / (2 TP + FP + FN)`` (0 when there are no positives
    predicted or present, as sklearn's ``zero_division=0``)."""
    tp, _, fp, fn = _confusion(*_pair(pred, target))
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def matthews_corrcoef(
    pred: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray
) -> float:
    """``(TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))``; 0 when a factor is 0 (a constant
    prediction or target), as sklearn."""
    tp, tn, fp, fn = _confusion(*_pair(pred, target))
    denom = math.sqrt(float(tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denom == 0 else (tp * tn - fp * fn) / denom


def pearson(pred: Sequence[float] | np.ndarray, target: Sequence[float] | np.ndarray) -> float:
    """Pearson's r in float64; ``nan`` when either side is constant (as scipy)."""
    p, t = (a.astype(np.float64) for a in _pair(pred, target))
    dp, dt = p - p.mean(), t - t.mean()
    denom = math.sqrt(float(np.sum(dp * dp)) * float(np.sum(dt * dt)))
    return math.nan if denom == 0 else float(np.sum(dp * dt)) / denom


def average_ranks(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties given the mean of the ranks they span (scipy "average")."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(a.size, dtype=np.float64)
    sorted_a = a[order]
    i = 0
    while i < a.size:
        j = i
        while j + 1 < a.size and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1  # mean of the 1-based ranks i+1 .. j+1
        i = j + 1
    return ranks


def spearman(pred: Sequence[float] | np.ndarray, target: Sequence[float] | np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the average ranks (ties share their mean rank)."""
    p, t = _pair(pred, target)
    return pearson(average_ranks(p), average_ranks(t))


_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1_score,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def glue_metrics(
    task: str, pred: Sequence[float] | np.ndarray, target: Sequence[float] | np.ndarray
) -> dict[str, float]:
    """Every metric of ``task`` (headline first): class ids for classification, scores for STS-B."""
    spec = _spec(task)
    return {m: _METRICS[m](np.asarray(pred), np.asarray(target)) for m in spec.metrics}


# --------------------------------------------------------------------------------------------
# Models: a classifier from a pretrained encoder
# --------------------------------------------------------------------------------------------


class SequenceClassifier(EffiModel):
    """A GLUE head on any encoder whose forward returns ``ModelOutput.hidden`` (B, T, D), e.g. the
    dense :class:`~effiformer.models.Transformer` with ``causal=False``: hidden[:, 0] ([CLS]) ->
    :class:`~effiformer.layers.heads.SequenceClassificationHead`. Encoders with an ``encode``
    method (the dense Transformer) skip their own output head (the tied MLM head); others run it
    and it is ignored.

    forward(input_ids (B, T), *, labels (B,) | None, attention_mask (B, T) | None,
    token_type_ids: ignored, the dense encoder has no segment embedding)
    -> ModelOutput(logits (B, n_labels), loss, hidden (B, T, D)).
    """

    def __init__(self, encoder: nn.Module, n_labels: int) -> None:
        super().__init__()
        config = getattr(encoder, "config", None)
        if config is None:
            raise TypeError(f"encoder must carry a .config, got {type(encoder).__name__}")
        if getattr(config, "causal", False):
            raise ValueError("a GLUE classifier needs a bidirectional encoder (causal=False)")
        self.config, self.n_labels = config, n_labels
        self.encoder = encoder
        self.head = SequenceClassificationHead(config.dim, n_labels, dropout=config.dropout)
        for p in self.head.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            else:
                nn.init.zeros_(p)

    def forward(
        self,
        input_ids: Tensor,
        *,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        encode = getattr(self.encoder, "encode", None)
        if encode is not None:
            enc = encode(input_ids, attention_mask=attention_mask)  # hidden (B, T, D), no head
        else:
            enc = self.encoder(input_ids, attention_mask=attention_mask)  # hidden (B, T, D)
        h = enc.hidden
        logits = self.head(h)  # (B, n_labels)
        loss = None if labels is None else sequence_classification_loss(logits, labels)
        return ModelOutput(
            logits=logits,
            loss=loss,
            hidden=h,
            aux=prefix_keys(enc.aux, "encoder."),
            updates=prefix_keys(enc.updates, "encoder."),
        )


def classifier_from_pretrained(model: nn.Module, n_labels: int) -> nn.Module:
    """A sequence classifier initialised from a pretrained model.

    :class:`~effiformer.models.funnel.FunnelForMaskedLM` -> encoder-only
    :class:`~effiformer.models.funnel.FunnelForSequenceClassification` with the pretrained
    encoder weights (the decoder and MLM head are dropped, paper sec. 4);
    :class:`~effiformer.models.funnel.FunnelElectra` -> the same from the discriminator's encoder;
    any other encoder -> :class:`SequenceClassifier` around it (weights shared, not copied).
    The new head is freshly initialised.
    """
    from ..models.funnel import FunnelElectra, FunnelForMaskedLM, FunnelForSequenceClassification

    if isinstance(model, FunnelForMaskedLM | FunnelElectra):
        source = model.funnel if isinstance(model, FunnelForMaskedLM) else model.discriminator
        clf = FunnelForSequenceClassification(model.config, n_labels)
        clf.funnel.encoder.load_state_dict(source.encoder.state_dict())
        return clf
    return SequenceClassifier(model, n_labels)


def _head_kind(model: nn.Module) -> str | None:
    """How :func:`load_classifier` rebuilds ``model``: "funnel", "encoder", or None (unknown)."""
    from ..models.funnel import FunnelForSequenceClassification

    if isinstance(model, FunnelForSequenceClassification):
        return "funnel"
    if isinstance(model, SequenceClassifier):
        return "encoder"
    return None


def load_classifier(directory: PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """The fine-tuned classifier of a GLUE training checkpoint (run or checkpoint directory)
    and the checkpoint's meta (``meta["task"]`` is :meth:`GlueTask.describe`)."""
    from safetensors.torch import load_model as st_load_model

    from ..checkpoint import WEIGHTS, CheckpointError, load_config
    from ..models.funnel import FunnelForSequenceClassification
    from ..registry import build_model
    from ..train import META as META_NAME
    from ..train import resolve_checkpoint, verify_checkpoint

    d = resolve_checkpoint(directory)
    meta = verify_checkpoint(d)
    task = meta.get("task") or {}
    if not str(task.get("task", "")).startswith("glue-"):
        raise CheckpointError(f"{d} is not a GLUE fine-tuning checkpoint (task {task.get('task')})")
    config = load_config(d)
    n_labels = int(task["n_labels"])
    if task.get("head") == "funnel":
        model: nn.Module = FunnelForSequenceClassification(config, n_labels)
    elif task.get("head") == "encoder":
        model = SequenceClassifier(build_model(config), n_labels)
    else:
        raise CheckpointError(f"{d}: unknown classifier kind {task.get('head')!r} in {META_NAME}")
    missing, unexpected = st_load_model(model, d / WEIGHTS, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{d / WEIGHTS} does not match a {task.get('head')} classifier: missing "
            f"{sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
        )
    meta["path"] = str(d)
    return model, meta


# --------------------------------------------------------------------------------------------
# Task
# --------------------------------------------------------------------------------------------


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
        self.spec = _spec(task)
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

    def _check_model(self, model: nn.Module) -> None:
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
        self._check_model(model)
        self.head = _head_kind(model)  # recorded in checkpoints (describe) for load_classifier
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
            for i in range(0, len(examples), self.eval_batch_size):
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
# Command line: python -m effiformer.tasks.glue (the `effiformer train` CLI has no --task yet)
# --------------------------------------------------------------------------------------------


def classifier_from_checkpoint(directory: PathLike, n_labels: int) -> nn.Module:
    """A classifier initialised from a pretraining checkpoint (run or checkpoint directory)
    written by :func:`effiformer.train.train` on an :class:`~effiformer.tasks.mlm.MLMTask`:
    Funnel MLM (``funnel.encoder.*``) or ELECTRA (``discriminator.encoder.*``) weights go into
    an encoder-only Funnel classifier; a dense encoder is wrapped in :class:`SequenceClassifier`.
    """
    from safetensors import safe_open

    from ..checkpoint import WEIGHTS, CheckpointError, load_config, load_model
    from ..models.funnel import FunnelConfig, FunnelForSequenceClassification
    from ..train import resolve_checkpoint

    d = resolve_checkpoint(directory)
    config = load_config(d)
    if not isinstance(config, FunnelConfig):
        return SequenceClassifier(load_model(d), n_labels)
    with safe_open(str(d / WEIGHTS), framework="pt") as f:
        keys = list(f.keys())
        for prefix in ("funnel.encoder.", "discriminator.encoder."):
            enc = {k[len(prefix) :]: f.get_tensor(k) for k in keys if k.startswith(prefix)}
            if enc:
                break
    if not enc:
        raise CheckpointError(f"{d / WEIGHTS} holds no Funnel encoder weights")
    clf = FunnelForSequenceClassification(config, n_labels)
    try:
        clf.funnel.encoder.load_state_dict(enc)
    except RuntimeError as e:
        raise CheckpointError(f"{d / WEIGHTS}: encoder weights do not fit its config: {e}") from e
    return clf


def main(argv: list[str] | None = None) -> int:
    """``python -m effiformer.tasks.glue finetune|eval``: fine-tune a pretraining checkpoint on
    a GLUE task, or evaluate a fine-tuned checkpoint (see docs/glue.md)."""
    import argparse
    import json
    import logging
    import sys

    from ..train import TrainConfig, train

    p = argparse.ArgumentParser(prog="python -m effiformer.tasks.glue", description=main.__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    ft = sub.add_parser("finetune", help="fine-tune a pretraining checkpoint")
    ft.add_argument("--init", required=True, help="pretraining run or checkpoint directory")
    ft.add_argument("--task", required=True, choices=list(GLUE_TASKS))
    ft.add_argument("--data", required=True, help="the task's folder, e.g. .../glue/SST-2")
    ft.add_argument("--batch", type=int, default=32)
    ft.add_argument("--max-len", type=int, default=128)
    ft.add_argument("--steps", type=int, default=1000)
    ft.add_argument("--lr", type=float, default=1e-4)
    ft.add_argument("--warmup", type=int, default=100)
    ft.add_argument("--time-budget", type=float)
    ft.add_argument("--eval-every", type=int, default=200)
    ft.add_argument("--seed", type=int, default=0)
    ft.add_argument("--device", default="auto")
    ft.add_argument("--out", required=True)
    ev = sub.add_parser("eval", help="evaluate a fine-tuned checkpoint")
    ev.add_argument("checkpoint", help="fine-tuning run or checkpoint directory")
    ev.add_argument("--split", default="dev", help="dev (default), train, or test (MRPC)")
    ev.add_argument("--data", help="the task's folder (default: the one recorded at training)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from ..checkpoint import CheckpointError
    from ..data.tokenizer import TokenizerError

    try:
        if args.command == "finetune":
            from ..train import resolve_checkpoint

            init = resolve_checkpoint(args.init)
            tokenizer = SubwordTokenizer.load(init)
            task = GlueTask(
                args.task,
                args.data,
                tokenizer,
                max_len=args.max_len,
                batch_size=args.batch,
                seed=args.seed,
            )
            torch.manual_seed(args.seed)
            model = classifier_from_checkpoint(init, task.spec.num_labels)
            hist = train(
                model,
                task,
                TrainConfig(
                    steps=args.steps,
                    lr=args.lr,
                    warmup=args.warmup,
                    weight_decay=0.01,
                    time_budget=args.time_budget,
                    eval_every=args.eval_every,
                    eval_split="valid",
                    seed=args.seed,
                    device=args.device,
                    out_dir=args.out,
                    model_name=f"{task.name}-from-{init.parent.name}",
                ),
            )
            print(json.dumps({"task": task.name, "step": hist.step, **hist.evals[-1]}))
            return 0
        model, meta = load_classifier(args.checkpoint)
        saved = meta["task"]
        tokenizer = SubwordTokenizer.load(meta["path"])
        task = GlueTask(
            saved["task"].removeprefix("glue-"),
            args.data or saved["data"],
            tokenizer,
            max_len=saved["max_len"],
            batch_size=1,
            eval_batch_size=saved["eval_batch_size"],
        )
        result = task.evaluate(model, args.split)
        print(
            json.dumps(
                {
                    "checkpoint": meta["path"],
                    "task": task.name,
                    "split": args.split,
                    "step": meta.get("step"),
                    **result,
                }
            )
        )
        return 0
    except (ValueError, FileNotFoundError, KeyError, CheckpointError, TokenizerError) as e:
        print(f"effiformer.tasks.glue: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
