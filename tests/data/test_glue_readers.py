"""GLUE readers on the real files and on malformed fixtures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from effiformer.data.glue import GLUE_TASKS, MRPC_DEV_SIZE, GlueError, read_glue

FOLDERS = {"sst2": "SST-2", "cola": "CoLA", "rte": "RTE", "stsb": "STS-B", "mrpc": "MRPC"}


@pytest.fixture
def glue(shared_data) -> Path:
    """The real GLUE folders (skipped without them; an error in CI, see conftest.py)."""
    return shared_data("glue")


# (task, split) -> (rows, label counts) from the folders' READMEs (MRPC dev/train: our split).
REAL = {
    ("sst2", "train"): (67349, {1: 37569, 0: 29780}),
    ("sst2", "dev"): (872, {1: 444, 0: 428}),
    ("cola", "train"): (8551, {1: 6023, 0: 2528}),
    ("cola", "dev"): (527, {1: 365, 0: 162}),
    ("rte", "train"): (2490, {0: 1249, 1: 1241}),
    ("rte", "dev"): (277, {0: 146, 1: 131}),
    ("mrpc", "train"): (4076 - MRPC_DEV_SIZE, {1: 2753 - 265, 0: 1323 - 143}),
    ("mrpc", "dev"): (MRPC_DEV_SIZE, {1: 265, 0: 143}),
    ("mrpc", "test"): (1725, {1: 1147, 0: 578}),
    ("stsb", "train"): (5749, None),
    ("stsb", "dev"): (1500, None),
}


# ---- readers on the real files ------------------------------------------------------------


@pytest.mark.parametrize(("task", "split"), sorted(REAL))
def test_real_files_row_and_label_counts(glue: Path, task: str, split: str) -> None:
    examples = read_glue(task, glue / FOLDERS[task], split)
    rows, counts = REAL[(task, split)]
    assert len(examples) == rows
    spec = GLUE_TASKS[task]
    assert all((ex.text_b is not None) == spec.pair for ex in examples)
    assert all(ex.text_a for ex in examples)
    if counts is not None:
        assert dict(Counter(ex.label for ex in examples)) == counts
    else:
        scores = np.array([ex.label for ex in examples])
        assert scores.min() == 0.0 and scores.max() == 5.0


def test_real_first_examples(glue: Path) -> None:
    sst = read_glue("sst2", glue / "SST-2", "dev")[0]
    assert (sst.text_a, sst.text_b, sst.label, sst.line) == (
        "it 's a charming and often affecting journey . ",
        None,
        1,
        2,
    )
    cola = read_glue("cola", glue / "CoLA", "train")[0]  # no header: line 1 is an example
    assert (cola.text_a, cola.label, cola.line) == (
        "Our friends won't buy this analysis, let alone the next one we propose.",
        1,
        1,
    )
    rte = read_glue("rte", glue / "RTE", "train")[0]
    assert (rte.text_b, rte.label) == ("Weapons of Mass Destruction Found in Iraq.", 1)
    sts = read_glue("stsb", glue / "STS-B", "dev")[1]
    assert (sts.text_a, sts.text_b, sts.label) == (
        "A young child is riding a horse.",
        "A child is riding a horse.",
        4.75,
    )
    mrpc = read_glue("mrpc", glue / "MRPC", "train")[0]  # the BOM is not part of the header
    assert mrpc.label == 1 and mrpc.text_a.startswith("Amrozi accused his brother")


def test_mrpc_dev_split_is_fixed_and_disjoint(glue: Path) -> None:
    train = read_glue("mrpc", glue / "MRPC", "train")
    dev = read_glue("mrpc", glue / "MRPC", "dev")
    train_lines, dev_lines = {e.line for e in train}, {e.line for e in dev}
    assert not train_lines & dev_lines
    assert train_lines | dev_lines == set(range(2, 4078))  # every row of the file, once
    # The split is frozen: these are the file lines of the first dev pairs and their sum.
    assert [e.line for e in dev[:5]] == [56, 60, 65, 70, 72]
    assert sum(dev_lines) == 846216
    assert read_glue("MRPC", glue / "MRPC", "dev") == dev  # names are case/hyphen-insensitive


# ---- malformed input ----------------------------------------------------------------------


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_missing_folder_file_and_split(tmp_path: Path) -> None:
    with pytest.raises(GlueError, match="nowhere: no such directory"):
        read_glue("sst2", tmp_path / "nowhere")
    (tmp_path / "SST-2").mkdir()
    with pytest.raises(GlueError, match=r"SST-2/dev\.tsv: no such file \(the dev split"):
        read_glue("sst2", tmp_path / "SST-2", "dev")
    with pytest.raises(ValueError, match="unknown GLUE task 'mnli'"):
        read_glue("mnli", tmp_path)
    with pytest.raises(ValueError, match="splits"):
        read_glue("sst2", tmp_path / "SST-2", "test")


def test_wrong_columns_and_widths(tmp_path: Path) -> None:
    d = tmp_path / "SST-2"
    path = _write(d, "train.tsv", "text\tlabel\ngood\t1\n")
    with pytest.raises(GlueError, match=r"train\.tsv:1: header \['text', 'label'\] lacks"):
        read_glue("sst2", d)
    _write(d, "train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\textra\n")
    with pytest.raises(GlueError, match=rf"{path}:3: expected 2 tab-separated columns, got 3"):
        read_glue("sst2", d)
    rte = _write(tmp_path / "RTE", "train.tsv", "sentence1\tsentence2\tlabel\tidx\na\tb\t0\n")
    with pytest.raises(GlueError, match=rf"{rte}:2: expected 4 tab-separated columns, got 3"):
        read_glue("rte", tmp_path / "RTE")
    _write(tmp_path / "E", "train.tsv", "")
    with pytest.raises(GlueError, match="the file is empty"):
        read_glue("sst2", tmp_path / "E")
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "train.tsv").write_bytes(b"sentence\tlabel\n\xff\t1\n")
    with pytest.raises(GlueError, match="not UTF-8 text"):
        read_glue("sst2", tmp_path / "B")


def test_labels_outside_the_label_set(tmp_path: Path) -> None:
    sst = _write(tmp_path / "SST-2", "train.tsv", "sentence\tlabel\ngood\t1\nmeh\t2\n")
    with pytest.raises(GlueError, match=rf"{sst}:3: label '2' is not one of the task's labels"):
        read_glue("sst2", tmp_path / "SST-2")
    sts_text = "sentence1\tsentence2\tscore\na\tb\t4.5\nc\td\t5.5\n"
    sts = _write(tmp_path / "STS-B", "train.tsv", sts_text)
    with pytest.raises(GlueError, match=rf"{sts}:3: score '5.5' is not a number in \[0, 5\]"):
        read_glue("stsb", tmp_path / "STS-B")
    _write(tmp_path / "STS-B", "train.tsv", "sentence1\tsentence2\tscore\na\tb\tnan\n")
    with pytest.raises(GlueError, match=":2: score 'nan'"):
        read_glue("stsb", tmp_path / "STS-B")
    # The GLUE-zip RTE layout (string labels, other column order) reads too; others do not.
    rte_text = "index\tsentence1\tsentence2\tlabel\n0\tp\th\tentailment\n1\tp\th\tnot_entailment\n"
    _write(tmp_path / "RTE", "train.tsv", rte_text)
    assert [e.label for e in read_glue("rte", tmp_path / "RTE")] == [0, 1]
    _write(tmp_path / "RTE", "train.tsv", rte_text + "2\tp\th\tneutral\n")
    with pytest.raises(GlueError, match=":4: label 'neutral'"):
        read_glue("rte", tmp_path / "RTE")


def test_cola_and_mrpc_layouts(tmp_path: Path) -> None:
    cola = tmp_path / "CoLA"
    _write(cola, "in_domain_train.tsv", "src\tlabel\tmark\tsentence\ngj04\t1\t\tFine.\n")
    with pytest.raises(GlueError, match="raw CoLA layout without a header"):
        read_glue("cola", cola)
    _write(cola, "in_domain_train.tsv", "gj04\t1\t\tFine.\ngj04\t0\t*\n")
    with pytest.raises(GlueError, match=":2: expected 4 tab-separated columns, got 3"):
        read_glue("cola", cola)
    _write(cola, "in_domain_train.tsv", "gj04\t1\t\tFine.\ngj04\t3\t*\tBad.\n")
    with pytest.raises(GlueError, match=":2: label '3'"):
        read_glue("cola", cola)
    mrpc = tmp_path / "MRPC"
    _write(mrpc, "msr_paraphrase_train.txt", "Quality\tID1\tID2\tS1\tS2\n1\t1\t2\ta\tb\n")
    with pytest.raises(GlueError, match=":1: expected the MSR header"):
        read_glue("mrpc", mrpc)
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    _write(mrpc, "msr_paraphrase_train.txt", header + "1\t1\t2\ta\tb\n")
    with pytest.raises(GlueError, match="too few to hold out a 408-pair dev split"):
        read_glue("mrpc", mrpc, "dev")
    _write(mrpc, "msr_paraphrase_train.txt", header + "yes\t1\t2\ta\tb\n")
    with pytest.raises(GlueError, match=":2: label 'yes'"):
        read_glue("mrpc", mrpc, "train")
