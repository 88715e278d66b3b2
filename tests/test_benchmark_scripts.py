"""The scripts under benchmarks/ that produce the README's figures still run and record what
the README reads from them (tiny sizes, fixed steps: nothing here is timed)."""

import importlib.util
import json
from pathlib import Path

import torch

from effiformer import load_model
from effiformer.data import load_corpus
from effiformer.tasks import LMTask

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_xl_vs_vanilla_records_longer_memory_evaluations_and_saves_models(tmp_path):
    xl_vs_vanilla = _script("xl_vs_vanilla")
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        assert xl_vs_vanilla.main([
            "--corpora", "tinyshakespeare", "--steps", "3", "--seq-len", "16", "--batch", "2",
            "--eval-mem", "64", "--eval-tokens", "200", "--eval-batch", "2", "--save-models",
            "--set", "dim=32", "n_heads=2", "n_layers=1", "ffn_dim=64", "--out", str(out),
        ]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "environment"
    records = {r["model"]: r for r in lines[1:]}
    assert set(records) == {"vanilla-small", "xl-small", "compressive-small"}
    assert all(r["steps"] == 3 and r["tokens_seen"] == 3 * 2 * 16 for r in records.values())
    assert "val_longer_memory" not in records["vanilla-small"]
    # The longer memory, then the same with distances clamped at the longest seen in training
    # (T - 1 + memory + compressed memory).
    assert records["xl-small"]["eval_longer_memory_clamped"] == {"mem_len": 64, "clamp_len": 31}
    assert records["compressive-small"]["eval_longer_memory_clamped"] == {
        "mem_len": 32, "cmem_len": 32, "clamp_len": 31,
    }  # fmt: skip
    for r in records.values():
        assert r["val"] > 0 and 150 < r["val_tokens"] <= 200
    # A saved model evaluates to the recorded value.
    corpus = load_corpus(*xl_vs_vanilla.CORPORA["tinyshakespeare"])
    task = LMTask(corpus, batch_size=2, seq_len=16, eval_batch_size=2, eval_tokens=200)
    saved = load_model(records["xl-small"]["saved"])
    assert abs(task.evaluate(saved, "valid")["bpc"] - records["xl-small"]["val"]) < 1e-9
