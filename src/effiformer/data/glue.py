"""GLUE (Wang et al. 2019, arXiv 1804.07461): readers for the raw task files and each task's spec
(files, pair or single sentence, label set, metrics). The metrics are in :mod:`effiformer.metrics`;
the fine-tuning task is :class:`effiformer.tasks.glue.GlueTask`.

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

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "GLUE_TASKS",
    "MRPC_DEV_SIZE",
    "GlueError",
    "GlueExample",
    "GlueSpec",
    "glue_spec",
    "mrpc_dev_keys",
    "read_glue",
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


def glue_spec(task: str) -> GlueSpec:
    """The spec of GLUE ``task`` (case, hyphens and underscores ignored: ``SST-2`` is ``sst2``)."""
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
    spec = glue_spec(task)
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
