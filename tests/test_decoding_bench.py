"""The decoding-latency function HAT-style measurements go through, and the translation benchmark
scripts at tiny sizes (structure only: nothing here asserts a time)."""

import json
from pathlib import Path

import pytest
import torch

from effiformer import create_model
from effiformer.bench.decoding import decoding_latency, trimmed_mean

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_trimmed_mean_drops_the_outer_deciles():
    assert trimmed_mean([100.0] + [1.0] * 8 + [-100.0]) == 1.0
    assert trimmed_mean([2.0]) == 2.0


def test_decoding_latency_runs_exactly_the_requested_steps():
    m = create_model("seq2seq-tiny")
    steps = []
    for block in m.decoder:  # count decoder calls of the first layer
        block.register_forward_hook(lambda mod, i, o: steps.append(1))
        break
    lat = decoding_latency(m, src_len=7, beam=3, steps=5, warmup=1, runs=2)
    assert len(steps) == 3 * 5  # 3 runs x 5 incremental steps, one token each
    assert lat.steps == 5 and lat.beam == 3 and lat.runs == 2 and len(lat.raw) == 2
    assert lat.total_s >= lat.decoder_s >= 0 and lat.encoder_s > 0
    assert m.training  # mode restored
    with pytest.raises(ValueError, match="seq_len"):
        decoding_latency(m, src_len=7, steps=64)


@pytest.mark.slow
@pytest.mark.reference
def test_decoding_vs_hf_script_runs(tmp_path, bench_script):
    pytest.importorskip("transformers")
    out = tmp_path / "r.jsonl"
    script = bench_script("decoding_vs_hf")
    assert script.main([
        "--model", "seq2seq-tiny", "--vocab-size", "64", "--src-len", "6", "--beam", "2",
        "--warmup", "1", "--runs", "1", "--rounds", "1", "--out", str(out),
    ]) == 0  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[1]["kind"] == "round" and records[1]["hf_generated"] == 6  # the same steps
    result = records[-1]
    # Same weights but HF's two sinusoid tables (seq_len x dim), which it stores as parameters.
    assert result["params_hf"] - result["params_effiformer"] == 2 * 64 * 32


@pytest.mark.slow
def test_translation_multi30k_script_runs(tmp_path, data_env, bench_script):
    data_env("multi30k")
    script = bench_script("translation_multi30k")
    assert script.main([
        "--max-steps", "2", "--time-budget", "600", "--eval-every", "0", "--eval-sentences", "4",
        "--test-sentences", "3", "--beam", "2", "--vocab-size", "500", "--max-tokens", "512",
        "--set", "dim=32", "n_heads=2", "n_layers=1", "ffn_dim=64", "--out", str(tmp_path),
    ]) == 0  # fmt: skip
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in lines]
    assert kinds[0] == "environment" and kinds[-1] == "test" and "eval" in kinds
    assert lines[-1]["sentences"] == 3 and "tok:13a" in lines[-1]["bleu_signature"]
    assert (tmp_path / "bleu_curve.png").is_file() and (
        tmp_path / "model" / "tokenizer.json"
    ).is_file()


def _tiny_parallel_folder(root):
    import random

    words = {"man": "Mann", "dog": "Hund", "red": "rot", "big": "groß", "a": "ein"}
    rng = random.Random(0)
    root.mkdir()
    for split, n in (("train", 120), ("val", 6), ("test_2016_flickr", 5)):
        pairs = [[rng.choice(list(words)) for _ in range(rng.randint(1, 6))] for _ in range(n)]
        (root / f"{split}.en").write_text("".join(" ".join(p) + ".\n" for p in pairs))
        (root / f"{split}.de").write_text(
            "".join(" ".join(words[w] for w in p) + ".\n" for p in pairs)
        )
    return root


def test_translation_multi30k_script_on_a_tiny_folder(tmp_path, bench_script):
    """The script's pipeline (TranslationTask, effiformer.train.train with the seq2seq recipe,
    evaluate_run) on a synthetic folder: no data set needed."""
    data = _tiny_parallel_folder(tmp_path / "data")
    script = bench_script("translation_multi30k")
    out = tmp_path / "out"
    assert script.main([
        "--data", str(data), "--max-steps", "4", "--time-budget", "600", "--eval-every", "2",
        "--log-every", "1", "--beam", "2", "--vocab-size", "100", "--max-tokens", "200",
        "--model", "seq2seq-tiny", "--out", str(out),
    ]) == 0  # fmt: skip
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in lines]
    assert kinds == ["environment", "setup"] + ["train"] * 4 + ["eval"] * 2 + ["test"]
    setup = lines[1]["recipe"]
    assert (setup["name"], setup["optimizer"], setup["schedule"]) == (
        "seq2seq",
        "adam",
        "inverse_sqrt",
    )
    assert (setup["lr"], setup["warmup"], tuple(setup["betas"]), setup["eps"]) == (
        1e-3, 1000, (0.9, 0.98), 1e-9,
    )  # fmt: skip
    train_s = [r["train_s"] for r in lines if r["kind"] == "train"]
    assert train_s == sorted(train_s) and all(r["tgt_tokens"] > 0 for r in lines[2:6])
    assert [r["step"] for r in lines if r["kind"] == "eval"] == [2, 4]
    test = lines[-1]
    assert test["sentences"] == 5 and test["step"] == 4 and "tok:13a" in test["bleu_signature"]
    assert len((out / "test_2016_flickr.hyp.de").read_text().splitlines()) == 5
    assert (out / "bleu_curve.png").is_file() and (out / "model" / "tokenizer.json").is_file()
    assert (out / "run" / "latest").is_file()


def test_translation_run_keeps_checkpoints_resumes_and_scores_every_convention(
    tmp_path, bench_script
):
    """Issue 23: the Multi30k script keeps the checkpoints averaging needs (``--checkpoint-every``
    / ``--keep``), a rerun of the same folder resumes from its checkpoint with the vocabulary
    saved there (the earlier records kept), and ``translation_conventions.py`` scores the run
    with the last checkpoint and with averages, under each decoding convention."""
    data = _tiny_parallel_folder(tmp_path / "data")
    script = bench_script("translation_multi30k")
    out = tmp_path / "out"
    common = [
        "--data", str(data), "--time-budget", "600", "--eval-every", "0", "--beam", "2",
        "--vocab-size", "100", "--max-tokens", "200", "--model", "seq2seq-tiny",
        "--checkpoint-every", "1", "--keep", "3", "--out", str(out),
    ]  # fmt: skip
    assert script.main(["--max-steps", "3", *common]) == 0
    assert script.main(["--max-steps", "5", *common]) == 0  # resumes at step 3
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    envs = [r for r in lines if r["kind"] == "environment"]
    assert [e["resumed"] for e in envs] == [False, True]
    assert [r["step"] for r in lines if r["kind"] == "test"] == [3, 5]
    ckpts = sorted(d.name for d in (out / "run").glob("step-*"))
    assert ckpts == ["step-00000003", "step-00000004", "step-00000005"]

    conventions = bench_script("translation_conventions")
    scored = tmp_path / "scored"
    assert conventions.main([
        "--run", str(out / "run"), "--average", "2", "3", "--out", str(scored),
    ]) == 0  # fmt: skip
    records = [json.loads(x) for x in (scored / "results.jsonl").read_text().splitlines()][1:]
    assert [(r["checkpoints"], r["decoding"]) for r in records] == [
        (c, d) for c in ("last", "avg2", "avg3") for d in (
            "beam5-lp1.0", "beam4-lp0.6-gnmt", "beam4-lp0.6-fairseq")
    ]  # fmt: skip
    assert all(r["sentences"] == 5 and "compound-split" in r["bleu_tok_signature"] for r in records)
    assert [(r["beam"], r["lenpen"], r["lenpen_form"]) for r in records[:3]] == [
        (5, 1.0, "fairseq"), (4, 0.6, "gnmt"), (4, 0.6, "fairseq"),
    ]  # fmt: skip
    # the averaged weights are other weights: another loss on the same split
    assert records[0]["loss"] != records[3]["loss"] != records[6]["loss"]
    assert (scored / "table.md").read_text().count("| avg3 |") == 3
    # asking for more checkpoints than the run kept: one clear line, nothing written
    assert conventions.main(["--run", str(out / "run"), "--average", "4", "--out",
                             str(tmp_path / "x")]) == 2  # fmt: skip
    assert not (tmp_path / "x").exists()


def test_the_decoder_spread_leaves_out_the_encoder_pass(monkeypatch):
    """Issue 23: the search runs its own encoder pass; the decoder's mean was corrected for it
    but its spread was not. A scripted clock (no time is measured): encoder passes of 1-10 ms,
    decoders of exactly 50 ms, so the decoder's spread is 0 and its mean 50 ms."""
    import types

    from effiformer.bench import decoding

    enc = [0.001 * (i + 1) for i in range(10)]
    ticks = []
    for e in enc:  # t0, t1 = t0 + encoder, t2 = t1 + (encoder again + decoder)
        start = ticks[-1] + 1.0 if ticks else 0.0
        ticks += [start, start + e, start + e + e + 0.05]
    clock = iter(ticks)
    monkeypatch.setattr(decoding, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    lat = decoding_latency(create_model("seq2seq-tiny"), src_len=5, beam=2, steps=3, warmup=0,
                           runs=10)  # fmt: skip
    assert lat.decoder_s == pytest.approx(0.05) and lat.decoder_std_s == pytest.approx(0, abs=1e-12)
    assert lat.encoder_s == pytest.approx(trimmed_mean(enc)) and lat.encoder_std_s > 0.001
