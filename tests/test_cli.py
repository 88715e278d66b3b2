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


def test_train_task_mlm_then_glue_then_eval(tmp_path, capsys, shared_data):
    """`effiformer train --task mlm`, then `--task glue-sst2 --init`, then `effiformer eval`."""
    import json

    shk = shared_data("tinyshakespeare/input.txt")
    glue = shared_data("glue/SST-2")
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
    lines = capsys.readouterr().out.strip().splitlines()
    evaluated = json.loads(lines[-2])  # the record, then a human line (issue 28)
    assert lines[-1].startswith("glue-sst2 dev (step 2): accuracy ") and "872 examples" in lines[-1]
    assert evaluated["task"] == "glue-sst2" and evaluated["examples"] == 872
    assert evaluated["accuracy"] == trained["val_accuracy"]
    assert main(["eval", str(pre)]) == 2
    assert "pretraining checkpoint" in capsys.readouterr().err


def test_train_task_flag_errors(tmp_path, capsys):
    assert main(["train", "--task", "glue-rte", "--out", str(tmp_path / "x")]) == 2
    assert "needs --init RUN" in capsys.readouterr().err


def test_python_m_effiformer_is_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "effiformer", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "effiformer train" in out
    for command in ("list", "train", "eval", "generate", "translate", "bench"):
        assert command in out.split("positional arguments:")[1].split("options:")[0]


XL_RUN = ("--batch", "2", "--no-progress", "--device", "cpu")


def test_eval_runtime_flags_on_an_xl_run(tmp_path, capsys):
    """`effiformer eval RUN --mem-len --clamp-len --same-length`: the XL runtime fields, through
    load_checkpoint(overrides=...); a field the model's config lacks is a clear error."""
    import json

    run = tmp_path / "xl"
    argv = ["train", "xl-tiny", "--steps", "2", *XL_RUN, "--eval-tokens", "200"]
    assert main([*argv, "--out", str(run)]) == 0
    capsys.readouterr()

    def evaluate(*flags: str) -> dict:  # one stream of 200 tokens: segments 2.. see memory
        argv = ["eval", str(run), "--eval-tokens", "200", "--batch", "1", "--device", "cpu"]
        assert main([*argv, *flags]) == 0
        return json.loads(capsys.readouterr().out.splitlines()[0])

    plain = evaluate()
    longer = evaluate("--mem-len", "512", "--clamp-len", "128", "--same-length")
    assert longer["overrides"] == {"mem_len": 512, "clamp_len": 128, "same_length": True}
    assert "overrides" not in plain and longer["tokens"] == plain["tokens"]
    assert longer["bpc"] != plain["bpc"]
    # a 2-step model hardly uses distances, so a clamp at 128 moves the loss by less than float32
    # resolution; a clamp at 4 shows that the setting reaches the model
    assert (
        evaluate("--mem-len", "512", "--clamp-len", "4", "--no-same-length")["bpc"] != longer["bpc"]
    )
    assert main(["eval", str(run), "--cmem-len", "8"]) == 2
    err = capsys.readouterr().err
    assert "--cmem-len: the xl model (XLConfig) has no cmem_len" in err
    assert "runtime settings: mem_len, clamp_len, same_length" in err


def test_train_evaluates_with_the_eval_runtime_flags(tmp_path, capsys):
    """`effiformer train --eval-mem-len ...`: every evaluation runs on the trained model
    reconfigured with them, which `effiformer eval --mem-len ...` reproduces."""
    import json

    run = tmp_path / "xl"
    flags = ("--eval-mem-len", "64", "--eval-clamp-len", "4", "--eval-same-length")
    # 600 tokens in 8 streams of ~75: segments 2 and 3 of each stream see the memory.
    argv = ["train", "xl-tiny", "--steps", "2", *XL_RUN, "--eval-tokens", "600", *flags]
    assert main([*argv, "--out", str(run)]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    def evaluate(*flags: str) -> dict:
        assert main(["eval", str(run), "--eval-tokens", "600", "--device", "cpu", *flags]) == 0
        return json.loads(capsys.readouterr().out.splitlines()[0])

    same = evaluate("--mem-len", "64", "--clamp-len", "4", "--same-length")
    assert same["bpc"] == trained["val_bpc"]  # the same reconfigured model on the same data
    assert evaluate()["bpc"] != trained["val_bpc"]
    assert (
        main(["train", "vanilla-tiny", "--eval-clamp-len", "8", "--out", str(tmp_path / "v")]) == 2
    )
    assert "--eval-clamp-len: the vanilla model (VanillaConfig) has no clamp_len" in (
        capsys.readouterr().err
    )


# ------------------------------------------------------------------------------------------------
# --version, --debug, one-line errors, parameter counts
# ------------------------------------------------------------------------------------------------


def test_version():
    import torch

    import effiformer

    proc = subprocess.run(
        [sys.executable, "-m", "effiformer", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"effiformer {effiformer.__version__} (torch {torch.__version__}")


def test_list_shows_parameter_counts(capsys):
    import effiformer

    assert main(["list", "vanilla-tiny"]) == 0
    line = capsys.readouterr().out.strip()
    n = effiformer.create_model("vanilla-tiny").num_params()
    assert f"{n / 1e3:.0f}K" in line.split()  # 124,672 -> 125K, counted on the meta device


def test_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("effiformer eval: error: checkpoint directory")
    proc = subprocess.run(
        [sys.executable, "-m", "effiformer", "eval", str(tmp_path / "nope"), "--debug"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "CheckpointError" in proc.stderr


def test_unexpected_errors_are_one_line_too(monkeypatch, capsys):
    from effiformer.cli import list_cmd

    def broken(args):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(list_cmd, "run", broken)
    assert main(["list"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "effiformer list: error: RuntimeError: something inside broke (this looks like a bug; "
        "rerun with --debug for the traceback)\n"
    )


# ------------------------------------------------------------------------------------------------
# generate
# ------------------------------------------------------------------------------------------------


def test_generate_from_trained_dense_xl_and_compressive_runs(tmp_path, capsys):
    """`effiformer generate RUN --prompt ...` on tiny runs of the three causal families: the
    prompt, then --max-new-tokens bytes of the run's byte vocabulary; a seed fixes the sample."""
    import torch

    from effiformer import load_model
    from effiformer.checkpoint import resolve_checkpoint
    from effiformer.data import Vocab

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    for name in ("vanilla-tiny", "xl-tiny", "compressive-tiny"):
        run = tmp_path / name
        argv = ["train", name, "--data", str(text), "--format", "text", "--steps", "3",
                "--batch", "2", "--seq-len", "16", "--eval-every", "0", "--eval-tokens", "64",
                "--no-progress", "--device", "cpu", "--out", str(run)]  # fmt: skip
        assert main(argv) == 0
        capsys.readouterr()
        gen = ["generate", str(run), "--prompt", "the quick", "--max-new-tokens", "24",
               "--top-k", "5", "--seed", "3", "--device", "cpu"]  # fmt: skip
        assert main(gen) == 0
        first = capsys.readouterr().out
        assert main(gen) == 0
        assert capsys.readouterr().out == first  # same seed, same text
        assert first.startswith("the quick")
        # the Python API on the run directory gives the same sample
        model = load_model(run).eval()
        vocab = Vocab.from_json((resolve_checkpoint(run) / "vocab.json").read_text())
        ids = vocab.encode("the quick")[None, :]  # (1, 9)
        out = model.generate(ids, 24, top_k=5, generator=torch.Generator().manual_seed(3))
        assert out.shape == (1, 9 + 24)
        expected = vocab.decode(out[0])
        assert first == expected + ("" if expected.endswith("\n") else "\n")
    assert main(["generate", str(tmp_path / "vanilla-tiny"), "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# a folder of effiformer.save_model where a command takes a run (issue 28, item 5)
# ------------------------------------------------------------------------------------------------


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"effiformer {command}: error: "), err
    return err


def test_generate_takes_a_saved_byte_level_model(tmp_path, capsys):
    """The README's `effiformer.save_model(model, "ckpt")` then `effiformer generate ckpt`: a
    byte-level model (vocab_size 256) needs no vocabulary, the prompt is its UTF-8 bytes."""
    import torch

    import effiformer
    from effiformer.data import Vocab

    torch.manual_seed(0)
    model = effiformer.create_model("vanilla-tiny")
    ckpt = tmp_path / "ckpt"
    effiformer.save_model(model, ckpt)
    gen = ["generate", str(ckpt), "--prompt", "the quick", "--max-new-tokens", "12",
           "--top-k", "5", "--seed", "3", "--device", "cpu"]  # fmt: skip
    assert main(gen) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    vocab = Vocab.byte_level()
    ids = vocab.encode("the quick")[None, :]  # (1, 9): the prompt's bytes
    out = model.eval().generate(ids, 12, top_k=5, generator=torch.Generator().manual_seed(3))
    expected = vocab.decode(out[0])
    assert captured.out == expected + ("" if expected.endswith("\n") else "\n")
    assert captured.out.startswith("the quick")
    # without a prompt: it starts from a line break and prints only what the model wrote
    assert main(["generate", str(ckpt), "--max-new-tokens", "4", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.endswith("\n")

    # another vocabulary size: the ids mean nothing without the run's vocab.json, said in one line
    small = tmp_path / "v10"
    effiformer.save_model(effiformer.create_model("vanilla-tiny", vocab_size=10), small)
    assert main(["generate", str(small), "--prompt", "ab", "--device", "cpu"]) == 2
    err = _one_error_line(capsys, "generate")
    assert "saved model" in err and "vocab.json" in err and "vocab_size=10" in err
    # ... which can be put beside the weights (of the model's size)
    (small / "vocab.json").write_text(Vocab(unit="char", tokens=tuple("abcdefg \n")).to_json())
    assert main(["generate", str(small), "--prompt", "ab", "--device", "cpu"]) == 2
    assert "9 tokens but the model's vocab_size is 10" in _one_error_line(capsys, "generate")
    (small / "vocab.json").write_text(Vocab(unit="char", tokens=tuple("abcdefgh \n")).to_json())
    argv = ["generate", str(small), "--prompt", "ab", "--max-new-tokens", "3", "--device", "cpu"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("ab")
    # an encoder-decoder is named as such, not a traceback
    effiformer.save_model(effiformer.create_model("seq2seq-tiny"), tmp_path / "s2s")
    assert main(["generate", str(tmp_path / "s2s"), "--device", "cpu"]) == 2
    assert "effiformer translate" in _one_error_line(capsys, "generate")


def test_eval_resume_and_translate_name_what_a_saved_model_lacks(tmp_path, capsys):
    """A saved model has weights and a config only: commands that need more (eval: the task and
    data; train --resume: the trainer state; translate: the tokenizer) say so in one line, exit 2,
    instead of calling the folder an interrupted save."""
    import effiformer

    ckpt = tmp_path / "ckpt"
    effiformer.save_model(effiformer.create_model("vanilla-tiny"), ckpt)
    assert main(["eval", str(ckpt), "--no-progress"]) == 2
    err = _one_error_line(capsys, "eval")
    assert "saved model" in err and "run folder" in err and "interrupted" not in err
    assert main(["train", "--resume", str(ckpt), "--no-progress"]) == 2
    err = _one_error_line(capsys, "train")
    assert "saved model" in err and "trainer.pt" in err and "interrupted" not in err
    assert main(["translate", str(ckpt), "--device", "cpu"]) == 2
    assert "not a translation model" in _one_error_line(capsys, "translate")
    s2s = tmp_path / "s2s"
    effiformer.save_model(effiformer.create_model("seq2seq-tiny"), s2s)
    assert main(["translate", str(s2s), "--device", "cpu"]) == 2
    err = _one_error_line(capsys, "translate")
    assert "saved model" in err and "tokenizer.json" in err and "interrupted" not in err


def test_translate_takes_a_saved_model_with_its_tokenizer_beside(tmp_path, capsys, monkeypatch):
    import io

    import torch

    import effiformer
    from effiformer.data.tokenizer import SubwordTokenizer

    tokenizer = SubwordTokenizer.train(
        ["a big dog runs.", "ein großer Hund läuft.", "a red man.", "ein roter Mann."],
        vocab_size=60,
        min_frequency=1,
    )
    torch.manual_seed(0)
    model = effiformer.create_model("seq2seq-tiny", vocab_size=tokenizer.vocab_size)
    folder = tmp_path / "m"
    effiformer.save_model(model, folder)
    tokenizer.save(folder)
    stdin = io.TextIOWrapper(io.BytesIO(b"a big dog runs.\n\na red man.\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["translate", str(folder), "--beam", "1", "--device", "cpu", "--no-progress"]) == 0
    assert capsys.readouterr().out.split("\n")[1::2] == ["", ""]  # three lines, the empty kept


def test_train_prints_each_log_line_once(tmp_path):
    # issue 28: tqdm's redirect beside the command line's own tqdm handler doubled every line
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "effiformer", "train", "vanilla-tiny", "--steps", "2",
         "--eval-every", "2", "--seq-len", "32", "--batch", "2", "--eval-tokens", "256",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "step 2: valid" in ln]
    assert len(lines) == 1, proc.stderr


def test_list_attention_one_line_per_part(capsys):
    # issue 28: no CLI way to list mechanisms
    from effiformer.attention import list_attentions

    assert main(["list", "--attention"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert [ln.split()[0] for ln in lines] == list_attentions()
    assert any(ln.split()[:2] == ["adaptive_span", "causal"] for ln in lines)
    assert main(["list", "--attention", "nothing*"]) == 1


def test_list_attentions_after_import_effiformer_as_the_readme_writes_it():
    code = (
        "import effiformer; a = effiformer.attention.list_attentions(); "
        "assert a == effiformer.list_attentions() and 'routing' in a; print(len(a))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 12


def test_argument_errors_are_one_line(capsys):
    # issue 28: argparse printed a 14-40 line usage block before the line that mattered
    import pytest

    for argv in (["train", "vanilla-tiny", "--device", "gpu"], ["bench", "--part", "nope"],
                 ["train", "vanilla-tiny", "--stepz", "5"]):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert "error:" in err and "--help" in err


def test_train_refuses_bad_numbers_and_a_used_out_before_loading_anything(tmp_path, capsys):
    """Issue 28 item 10: ``--steps -5`` is a usage error, and an ``--out`` that holds a run is
    refused before the corpus loads or the recipe line prints (one line, the run kept)."""
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["train", "vanilla-tiny", "--steps", "-5"])
    assert e.value.code == 2
    err = capsys.readouterr()
    assert "argument --steps: expected a positive integer, got '-5'" in err.err
    assert "recipe" not in err.out and "loaded" not in err.err
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest").write_text("step-00000002\n")
    assert main(["train", "vanilla-tiny", "--steps", "2", "--out", str(run)]) != 0
    out = capsys.readouterr()
    assert "already holds a run" in out.err and "--resume" in out.err
    assert "recipe" not in out.out and "loaded Corpus" not in out.err
    assert (run / "latest").read_text() == "step-00000002\n"


def test_train_eval_generate_and_translate_take_threads(tmp_path, capsys, monkeypatch):
    """Issue 28 item 9: ``--threads N`` sets torch's CPU threads for the command (and is refused
    at parse time when it is not a positive integer)."""
    import pytest
    import torch

    seen = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(n))
    run = tmp_path / "r"
    assert main(["train", "vanilla-tiny", "--steps", "1", "--eval-every", "0",
                 "--threads", "1", "--out", str(run), "--eval-tokens", "256"]) == 0  # fmt: skip
    assert main(["eval", str(run), "--threads", "2", "--eval-tokens", "256"]) == 0
    assert main(["generate", str(run), "--max-new-tokens", "2", "--threads", "3"]) == 0
    assert seen == [1, 2, 3]
    for command in ("train", "eval", "generate", "translate"):
        with pytest.raises(SystemExit):
            main([command, "x", "--threads", "0"])
        assert "--threads: expected a positive integer" in capsys.readouterr().err
