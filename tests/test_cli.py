"""The CLI is thin and its errors name the problem."""

import subprocess
import sys

from effiformer.cli import main


def test_list_prints_names(capsys):
    assert main(["list", "vanilla-*"]) == 0
    out = capsys.readouterr().out
    assert "vanilla-tiny" in out and "vanilla-small" in out


def test_list_no_match(capsys):
    assert main(["list", "zzz-*"]) == 1
    assert "no registered model matches" in capsys.readouterr().err


def test_help_shows_examples():
    out = subprocess.run(
        [sys.executable, "-m", "effiformer.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "examples:" in out and "effiformer bench" in out and "effiformer train" in out


def test_train_task_mlm_then_glue_then_eval(tmp_path, capsys):
    """`effiformer train --task mlm`, then `--task glue-sst2 --init`, then `effiformer eval`."""
    import json
    from pathlib import Path

    shk = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"
    glue = shk.parents[1] / "glue" / "SST-2"
    text = tmp_path / "text.txt"
    text.write_text(shk.read_text()[:60_000])
    pre, ft = tmp_path / "pre", tmp_path / "ft"
    assert main(["train", "funnel-tiny", "--task", "mlm", "--text", str(text), "--vocab-size",
                 "300", "--steps", "2", "--batch", "2", "--seq-len", "32", "--eval-every", "2",
                 "--out", str(pre)]) == 0  # fmt: skip
    assert main(["train", "--task", "glue-sst2", "--init", str(pre), "--data", str(glue),
                 "--steps", "2", "--batch", "4", "--max-len", "32", "--eval-every", "0",
                 "--out", str(ft)]) == 0  # fmt: skip
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", str(ft)]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["task"] == "glue-sst2" and evaluated["examples"] == 872
    assert evaluated["accuracy"] == trained["val_accuracy"]
    assert main(["eval", str(pre)]) == 2
    assert "pretraining checkpoint" in capsys.readouterr().err


def test_train_task_flag_errors(tmp_path, capsys):
    assert main(["train", "--task", "glue-rte", "--out", str(tmp_path / "x")]) == 2
    assert "needs --init RUN" in capsys.readouterr().err
