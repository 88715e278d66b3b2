"""The task registry: names, lookup, options as data, and `effiformer train` / `eval` resolving
tasks through it, so a task registered here appears on the command line without touching it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from effiformer.cli import build_parser, main
from effiformer.tasks import (
    BuildContext,
    TaskSetup,
    UnknownTaskError,
    get_task,
    list_tasks,
    register_task,
    registry,
    task_option,
)
from effiformer.tasks.registry import make_options

EXPECTED = [
    "lm", "mlm", "electra", "glue-sst2", "glue-cola", "glue-rte", "glue-mrpc", "glue-stsb", "translation",
    "mqar", "duplication", "listops",
]  # fmt: skip


def test_every_current_task_is_registered_in_order():
    assert list_tasks() == EXPECTED
    assert list_tasks("glue-*") == EXPECTED[3:8]
    for name in EXPECTED:
        spec = get_task(name)
        assert spec.name == name and spec.description and callable(spec.build)
    assert get_task("lm").evaluate is not None and get_task("glue-rte").evaluate is not None


def test_unknown_task_names_the_closest():
    with pytest.raises(UnknownTaskError, match="unknown task 'mlmm'.*closest first\\): mlm"):
        get_task("mlmm")


@dataclass(frozen=True, kw_only=True)
class _EchoOptions:
    echo_rows: int = task_option(3, "rows to echo")
    echo_word: str = task_option(help="the word to echo", metavar="WORD")


class _Built(Exception):
    pass


def _build_echo(options: _EchoOptions, context: BuildContext) -> TaskSetup:
    raise _Built(f"echo x{options.echo_rows} {options.echo_word} for {context.model_name}")


@pytest.fixture
def echo_task(monkeypatch):
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    return register_task("echo-test", _EchoOptions, _build_echo, description="a test task")


def test_registration_rules(echo_task):
    with pytest.raises(ValueError, match="already registered"):
        register_task("echo-test", _EchoOptions, _build_echo)
    with pytest.raises(ValueError, match="lowercase and hyphenated"):
        register_task("Echo_Test", _EchoOptions, _build_echo)

    @dataclass(kw_only=True)
    class Mutable:
        n: int = task_option(1, "n")

    with pytest.raises(TypeError, match="frozen"):
        register_task("mutable-test", Mutable, _build_echo)

    @dataclass(frozen=True, kw_only=True)
    class NoHelp:
        n: int = 1

    with pytest.raises(TypeError, match="no help text"):
        register_task("nohelp-test", NoHelp, _build_echo)


def test_options_are_data(echo_task):
    opts = make_options(_EchoOptions, {"echo_word": "hi"})
    assert opts == _EchoOptions(echo_rows=3, echo_word="hi")
    with pytest.raises(ValueError, match="--task echo-test needs --echo-word WORD"):
        make_options(_EchoOptions, {}, owner="--task echo-test")
    with pytest.raises(ValueError, match="unknown option 'echo_row'.*echo_rows"):
        make_options(_EchoOptions, {"echo_row": 1, "echo_word": "x"})


def test_a_registered_task_appears_in_train_help_and_resolves(echo_task, capsys):
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    help_text = train.format_help()
    assert "echo-test" in help_text and "--echo-rows" in help_text and "rows to echo" in help_text

    with pytest.raises(_Built, match="echo x5 hello for vanilla-tiny"):  # --debug: raised as is
        main(["train", "vanilla-tiny", "--task", "echo-test", "--echo-rows", "5",
              "--echo-word", "hello", "--debug"])  # fmt: skip
    assert main(["train", "vanilla-tiny", "--task", "echo-test", "--echo-word", "hello"]) == 1
    assert "error: _Built: echo x3 hello for vanilla-tiny" in capsys.readouterr().err
    assert main(["train", "vanilla-tiny", "--task", "echo-test"]) == 2
    assert "--task echo-test needs --echo-word WORD" in capsys.readouterr().err
    # Options of one task are refused by another, with the task that takes them named.
    assert main(["train", "vanilla-tiny", "--echo-word", "x"]) == 2
    err = capsys.readouterr().err
    assert "--task lm does not take --echo-word (that is for: echo-test)" in err
    assert main(["train", "vanilla-tiny", "--task", "echo-test", "--echo-word", "x",
                 "--max-len", "8"]) == 2  # fmt: skip
    assert "does not take --max-len (that is for: glue-*, listops)" in capsys.readouterr().err


def test_eval_dispatches_on_the_recorded_task(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "vanilla-tiny", "--steps", "1", "--batch", "2", "--seq-len", "16",
                 "--eval-tokens", "64", "--no-progress", "--device", "cpu",
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    meta = json.loads(next(out.glob("step-*/meta.json")).read_text())
    train_config = json.loads(next(out.glob("step-*/train_config.json")).read_text())
    assert meta["task"]["task"] == "lm" and train_config["task"] == "lm"
    assert train_config["task_options"]["batch"] == 2
    assert main(["eval", str(out), "--eval-tokens", "64"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    assert record["model"] == "vanilla-tiny" and 0 < record["tokens"] <= 64


def test_train_resumes_the_recorded_task_and_options(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--no-progress", "--device", "cpu", "--eval-tokens", "64"]
    assert main(["train", "vanilla-tiny", "--steps", "1", "--batch", "2", "--seq-len", "16",
                 "--out", str(out), *common]) == 0  # fmt: skip
    assert main(["train", "--resume", str(out), "--steps", "2", *common]) == 0
    stdout = capsys.readouterr().out
    assert "train config of the resumed run: AdamW lr 0.001" in stdout
    train_config = json.loads(next(out.glob("step-*/train_config.json")).read_text())
    assert train_config["task_options"]["seq_len"] == 16 and train_config["steps"] == 2
    assert main(["train", "--resume", str(out), "--task", "mlm"]) == 2
    assert "holds a 'lm' run, not --task mlm" in capsys.readouterr().err
