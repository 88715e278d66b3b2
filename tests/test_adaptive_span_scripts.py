"""benchmarks/adaptive_span_vs_dense.py and benchmarks/adaptive_span_report.py run and record
what they claim (tiny sizes, fixed steps: nothing here is timed)."""

import json
from pathlib import Path

import torch

from effiformer import load_model

ROOT = Path(__file__).resolve().parents[1]


def test_comparison_records_bpc_and_learned_spans_then_the_report_reads_them(
    tmp_path, data_env, bench_script
):
    data_env("tinyshakespeare/input.txt")  # the script's corpus
    vs_dense, report = bench_script("adaptive_span_vs_dense"), bench_script("adaptive_span_report")
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        assert vs_dense.main([
            "--steps", "2", "--seq-len", "16", "--batch", "2", "--eval-tokens", "128",
            "--eval-batch", "2", "--max-span", "64", "--save-models",
            "--set", "dim=32", "n_heads=2", "ffn_dim=64", "--out", str(out),
        ]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "environment"
    records = {r["model"]: r for r in lines[1:]}
    assert set(records) == {"vanilla-small", "span-xl", "span-vanilla"}
    assert all(r["steps"] == 2 and r["val"] > 0 for r in records.values())
    assert "spans" not in records["vanilla-small"]
    spans = records["span-xl"]["spans"]
    assert spans["max_span"] == 64 and len(spans["rows"]) == 4 * 2 and set(spans["per_layer"]) == {
        "0", "1", "2", "3",
    }  # fmt: skip
    assert records["span-vanilla"]["spans"]["max_span"] == 16
    # Same width for every model: the XL embedding follows --set dim.
    model = load_model(records["span-xl"]["saved"])
    assert model.config.embed_dim == 32 and model.config.n_layers == 4
    assert (out / "spans-span-xl.png").is_file()

    rep = tmp_path / "report"
    assert report.main([records["span-xl"]["saved"], "--out", str(rep)]) == 0
    rows = [json.loads(line) for line in (rep / "spans.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "environment" and len(rows) == 1 + 8
    saved = {(r["layer"], r["head"]): r["span"] for r in spans["rows"]}
    assert {(r["layer"], r["head"]): r["span"] for r in rows[1:]} == saved
    assert (rep / "spans.png").read_bytes()[:4] == b"\x89PNG"
    assert "mean span per layer" in (rep / "spans.txt").read_text()
