"""The translation task: batches, training through the shared trainer, exact resume, evaluation
with sacreBLEU, the run-directory functions behind `effiformer eval` / `translate`, bad input."""

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from effiformer import create_model
from effiformer.data import ParallelData, ParallelDataError
from effiformer.data.tokenizer import TokenizerError
from effiformer.tasks import Task
from effiformer.tasks.translation import (
    TranslationTask,
    evaluate_run,
    load_translation_run,
    translate_file,
)
from effiformer.train import TrainConfig, train


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


WORDS = {"man": "Mann", "dog": "Hund", "red": "rot", "big": "groß", "runs": "läuft", "a": "ein"}


def _pairs(n, seed):
    g = torch.Generator().manual_seed(seed)
    keys = list(WORDS)
    src, tgt = [], []
    for _ in range(n):
        k = int(torch.randint(2, 7, (1,), generator=g))
        words = [keys[int(i)] for i in torch.randint(0, len(keys), (k,), generator=g)]
        src.append(" ".join(words) + ".")
        tgt.append(" ".join(WORDS[w] for w in words) + ".")
    return src, tgt


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("para")
    for split, n, seed in (("train", 300, 0), ("val", 20, 1), ("test_2016_flickr", 15, 2)):
        src, tgt = _pairs(n, seed)
        (d / f"{split}.en").write_text("\n".join(src) + "\n")
        (d / f"{split}.de").write_text("\n".join(tgt) + "\n")
    return d


def _task(folder, **kw):
    kw.setdefault("vocab_size", 100)
    kw.setdefault("max_tokens", 200)
    return TranslationTask(ParallelData(folder, "en", "de"), **kw)


def _model(task, **over):
    torch.manual_seed(0)
    return create_model("seq2seq-tiny", vocab_size=task.tokenizer.vocab_size, **over)


def _config(tmp_path, **kw):
    base = dict(steps=4, lr=3e-3, warmup=1, eval_every=None, progress=False, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def test_batches_hold_shifted_targets_under_the_token_budget(folder):
    task = _task(folder)
    assert isinstance(task, Task)
    model = _model(task)
    it = task.train_batches(model)
    tok = task.tokenizer
    for _ in range(5):
        b = next(it)
        src, tgt_in, tgt = b.data["input_ids"], b.data["tgt_in"], b.data["targets"]
        assert max(src.shape[1], tgt.shape[1]) * src.shape[0] <= 200
        assert (tgt_in[:, 0] == tok.bos_id).all()
        for i in range(len(tgt)):  # tgt_in = BOS y, targets = y EOS
            n = int((tgt[i] != tok.pad_id).sum())
            assert tgt[i, n - 1] == tok.eos_id
            assert torch.equal(tgt_in[i, 1:n], tgt[i, : n - 1])
        assert ((src == tok.eos_id).sum(1) == 1).all()
    rows = [next(task.train_batches(model, r, 2)).data["input_ids"].shape[0] for r in (0, 1)]
    assert abs(rows[0] - rows[1]) <= 1


def test_trains_evaluates_and_resumes_exactly(folder, tmp_path):
    task = _task(folder)
    model = _model(task)
    cfg = _config(tmp_path, steps=4, out_dir=str(tmp_path / "a"), checkpoint_every=2)
    full = train(model, task, dataclasses.replace(cfg, keep_checkpoints=None))
    ckpt = Path(full.checkpoint)
    assert (ckpt / "tokenizer.json").is_file()
    assert json.loads((ckpt / "translation.json").read_text()) == {"src": "en", "tgt": "de"}
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["task"]["task"] == "translation" and meta["task"]["src"] == "en"

    task2 = _task(folder)
    rest = train(
        _model(task2),
        task2,
        _config(
            tmp_path,
            steps=4,
            out_dir=str(tmp_path / "b"),
            resume=str(tmp_path / "a" / "step-00000002"),
        ),
    )
    assert rest.start_step == 2
    assert rest.losses == full.losses[2:]  # bitwise: the same batches, the same RNG

    result = task.evaluate(model, "valid")
    for key in ("bleu", "chrf", "loss", "nll", "ppl", "tokens", "bleu_signature"):
        assert key in result
    assert result["sentences"] == 20 and "tok:13a" in result["bleu_signature"]
    assert result["loss"] >= result["nll"] > 0  # smoothing adds to the NLL


def test_a_trained_tiny_model_translates_and_the_run_functions_work(folder, tmp_path):
    task = _task(folder, eval_beam=2)
    model = _model(task, dropout=0.0)
    hist = train(
        model, task, _config(tmp_path, steps=120, lr=5e-3, warmup=10, out_dir=str(tmp_path / "run"))
    )
    run = tmp_path / "run"
    record = evaluate_run(run, "test_2016_flickr", beam=3)
    assert record["bleu"] > 30  # a word-for-word dictionary is easy
    # the beam given, the rest from the default convention (the run's model has none)
    assert (record["beam"], record["lenpen"], record["lenpen_form"]) == (3, 1.0, "fairseq")
    assert record["decoding"].startswith("lenpen, lenpen_form from fairseq-generate")
    hyps = Path(record["hypotheses"]).read_text().splitlines()
    assert len(hyps) == 15 and record["split"] == "test_2016_flickr"
    lines = ["a big dog runs.", "", "a red man."]
    out = translate_file(run, lines, src="en", tgt="de", beam=2)
    assert len(out) == 3 and out[1] == "" and "Hund" in out[0]
    with pytest.raises(ValueError, match="translates en->de, not de->en"):
        translate_file(run, lines, src="de", tgt="en")
    with pytest.raises(ValueError, match="translates en->de, not de->en"):
        evaluate_run(run, "val", src="de", tgt="en")
    with pytest.raises(ParallelDataError, match="no split 'nope'"):
        evaluate_run(run, "nope")
    assert hist.step == 120


def test_bad_input_gets_clear_errors(folder, tmp_path, caplog):
    task = _task(folder)
    # a sentence longer than the model's limit is refused at training, naming file and line
    short = _model(task, seq_len=6)
    with pytest.raises(ValueError, match=r"train\.(en|de) line \d+: the (source|target) sentence"):
        next(task.train_batches(short))
    # a model whose vocabulary does not match the tokenizer
    with pytest.raises(ValueError, match="vocab_size"):
        next(task.train_batches(create_model("seq2seq-tiny", vocab_size=64)))
    # a run directory without a tokenizer
    train(_model(task), task, _config(tmp_path, steps=1, out_dir=str(tmp_path / "r")))
    ckpt = tmp_path / "r" / (tmp_path / "r" / "latest").read_text().strip()
    (ckpt / "tokenizer.json").rename(ckpt / "moved.json")
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_translation_run(tmp_path / "r")
    (ckpt / "moved.json").rename(ckpt / "tokenizer.json")
    # a vocabulary of another language pair
    other = tmp_path / "fr"
    other.mkdir()
    (other / "translation.json").write_text(json.dumps({"src": "fr", "tgt": "en"}))
    with pytest.raises(ValueError, match="trained on fr-en, not en-de"):
        TranslationTask(
            ParallelData(folder, "en", "de"), task.tokenizer, tokenizer_source=str(other)
        )
    # resuming on the other direction is refused
    de_en = TranslationTask(ParallelData(folder, "de", "en"), task.tokenizer, max_tokens=200)
    with pytest.raises(ValueError, match="same data and direction"):
        de_en.load_state_dict(task.state_dict())
    # a sentence longer than the limit at translate time: truncated with a warning
    with caplog.at_level(logging.WARNING):
        out = translate_file(tmp_path / "r", ["a big dog " * 40], beam=1)
    assert len(out) == 1 and "truncated" in caplog.text
    # nothing written is lost: a failing evaluation leaves an earlier hypotheses file as it was
    target = tmp_path / "hyps.txt"
    target.write_text("earlier\n")
    with pytest.raises(ParallelDataError):
        evaluate_run(tmp_path / "r", "missing", out=target)
    assert target.read_text() == "earlier\n"


def test_the_cli_trains_resumes_evaluates_and_translates(folder, tmp_path, capsys):
    """`effiformer train NAME --task translation ...`, `--resume` (src, tgt and max_tokens come
    from the checkpoint), `effiformer eval RUN --split test_2016_flickr --beam 2 --out FILE`
    (BLEU, chrF and their signatures) and `effiformer translate RUN < in > out`."""
    import subprocess
    import sys

    from effiformer.checkpoint import read_train_config, resolve_checkpoint
    from effiformer.cli import main

    run = tmp_path / "run"
    argv = ["train", "seq2seq-tiny", "--task", "translation", "--data", str(folder), "--src",
            "en", "--tgt", "de", "--max-tokens", "200", "--vocab-size", "100", "--steps", "2",
            "--eval-every", "0", "--eval-sentences", "5", "--grad-accum", "2", "--no-progress",
            "--device", "cpu", "--out", str(run)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trained seq2seq-tiny (translation)" in out and "valid bleu" in out
    assert json.loads(out.splitlines()[-1])["val_sentences"] == 5
    assert main(["train", "--resume", str(run), "--steps", "3", "--no-progress"]) == 0
    capsys.readouterr()
    saved = read_train_config(resolve_checkpoint(run))
    assert saved["steps"] == 3 and saved["task"] == "translation"
    assert {k: saved["task_options"][k] for k in ("src", "tgt", "max_tokens")} == {
        "src": "en", "tgt": "de", "max_tokens": 200,
    }  # fmt: skip

    hyps = tmp_path / "hyps.de"
    assert main(["eval", str(run), "--split", "test_2016_flickr", "--beam", "2", "--out",
                 str(hyps), "--device", "cpu", "--no-progress"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    record = json.loads(lines[0])
    assert record["split"] == "test_2016_flickr" and record["beam"] == 2
    assert record["sentences"] == 15 and len(hyps.read_text().splitlines()) == 15
    assert " BLEU " in lines[1] and " chrF " in lines[1] and str(hyps) in lines[1]
    assert lines[2] == f"BLEU signature: {record['bleu_signature']}"
    assert "tok:13a" in lines[2] and lines[3].startswith("chrF signature: nrefs:1")
    assert main(["eval", str(run), "--split", "nope", "--no-progress"]) == 2
    assert "no split 'nope'" in capsys.readouterr().err
    assert main(["eval", str(run), "--beam", "0", "--no-progress"]) == 2
    assert "beam must be a positive integer" in capsys.readouterr().err

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "effiformer", "translate", str(run), "--beam", "2", "--device",
         "cpu"],
        input="a big dog runs.\n\na red man.\n",
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"},
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = proc.stdout.split("\n")
    assert len(got) == 4 and got[1] == "" and got[3] == ""  # three lines, the empty one kept
    assert main(["translate", str(run), "--src", "de", "--tgt", "en"]) == 2
    assert "translates en->de, not de->en" in capsys.readouterr().err


def test_the_cli_refuses_a_model_that_is_not_an_encoder_decoder(folder, tmp_path, capsys):
    from effiformer.cli import main

    argv = ["train", "vanilla-tiny", "--task", "translation", "--data", str(folder), "--src",
            "en", "--tgt", "de", "--out", str(tmp_path / "x")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--task translation trains encoder-decoder models" in err and "seq2seq-tiny" in err
    assert main(["train", "seq2seq-tiny", "--task", "translation", "--data", str(folder)]) == 2
    assert "needs --src LANG, --tgt LANG" in capsys.readouterr().err
