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
