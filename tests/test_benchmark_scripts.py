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


def test_xl_vs_vanilla_records_longer_memory_evaluations_and_saves_models(tmp_path, data_env):
    data_env("tinyshakespeare/input.txt")  # the script's corpus
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


def test_funnel_flops_counts_the_dense_encoder_exactly():
    """The FLOP counter sees every matmul of the dense row, SDPA's CPU kernels included (they
    have no formula in PyTorch): 18 layers x (3 x projections and FFN + 3.5 x attention), plus the
    tied LM head's forward (its logits are computed but not in the loss)."""
    funnel_flops = _script("funnel_flops")
    torch.manual_seed(0)
    r = funnel_flops.encoder_pair(64, 32, 1)
    b, t, d, f, n_layers, vocab = 1, 32, 64, 256, 18, 1000
    linear = 2 * b * t * (4 * d * d + 2 * d * f)
    attention = 4 * b * t * t * d
    dense = n_layers * (3 * linear + 3.5 * attention) + 2 * b * t * d * vocab
    assert r["dense_gflop"] * 1e9 == dense
    assert 0.5 < r["ratio"] < 0.7  # pooling halves the length twice; relative attention costs more


def test_sparse_flops_counts_the_pattern_and_the_plan(tmp_path):
    sparse_flops = _script("sparse_flops")
    out = tmp_path / "flops.jsonl"
    assert sparse_flops.main(["--lengths", "1024", "--out", str(out)]) == 0
    rows = {r["config"]: r for r in map(json.loads, out.read_text().splitlines())}
    fixed = rows["fixed-128-c32"]
    # the plan computes at least the pattern; summary keys make fixed far denser than strided
    assert fixed["computed_gflop_fwd_bwd"] >= fixed["pattern_gflop_fwd_bwd"]
    assert rows["strided-128"]["keys_per_query"] < fixed["keys_per_query"]
    assert fixed["flop_limit_layer"] < fixed["flop_limit_attention"]


def test_sparse_speed_times_every_workload_interleaved(tmp_path):
    sparse_speed = _script("sparse_speed")
    out = tmp_path / "speed.jsonl"
    threads = torch.get_num_threads()
    try:
        assert sparse_speed.main(["--lengths", "256", "--rounds", "1", "--threads", "1",
                                  "--out", str(out)]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    names = {r["name"] for r in map(json.loads, out.read_text().splitlines())}
    assert {"sdpa", "vanilla-small", "sparse-bench-fixed-128"} <= names


def test_lm_mechanisms_rows_build_the_named_attention_in_the_same_decoder():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        rows = _script("lm_mechanisms_tinyshakespeare").ROWS
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from effiformer import create_model, get_config
    from effiformer.config import parse_overrides

    expected = {
        "dense": "dense",
        "sparse-strided": "sparse",
        "sparse-fixed": "sparse",
        "adaptive-span": "adaptive_span",
        "routing": "routing",
        "lsh": "lsh",
    }
    for row, (name, sets) in rows.items():
        model = create_model(name, **parse_overrides(get_config(name), ["dropout=0.0", *sets]))
        if row in expected:
            assert name == "vanilla-small"
            assert model.config.attention.name == expected[row], row
        out = model(torch.randint(0, 256, (1, 64)))
        assert out.logits.shape == (1, 64, model.config.vocab_size)
    assert rows["sparse-strided"][1][1:] == ["attention.pattern=strided", "attention.stride=16"]
