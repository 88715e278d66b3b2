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


def test_key_pe_script_splits_the_score_and_reads_quality_cells(tmp_path, bench_script):
    """benchmarks/adaptive_span_key_pe.py: the position term is linear in key_pe (zero with
    key_pe at zero, doubled with key_pe doubled) and the content term does not move with it;
    on a smoke quality run it writes a row per cell, weights and layer, and refuses an unknown
    cell with one line."""
    from effiformer import create_model
    from effiformer.bench.quality import run_quality
    from effiformer.tasks.mqar import MQARTask

    script = bench_script("adaptive_span_key_pe")
    torch.manual_seed(0)
    model = create_model(
        "vanilla-tiny",
        attention={"name": "adaptive_span", "max_span": 64},
        seq_len=64,
        init="lecun",
    )  # init="lecun": the quality suite's
    task = MQARTask(seq_len=64, batch_size=4, seed=0)
    x, _ = task.split("test")
    x = x[:4]
    needs = [[(2 * task.n_pairs + 1, 1)] for _ in range(4)]  # any (query, value) pairs
    (pe,) = [p for n, p in model.named_parameters() if n.endswith("key_pe")]
    one = script.score_terms(model, x, needs, task.n_pairs)
    with torch.no_grad():
        pe.mul_(2.0)
    two = script.score_terms(model, x, needs, task.n_pairs)
    with torch.no_grad():
        pe.zero_()
    zero = script.score_terms(model, x, needs, task.n_pairs)
    # the first layer's input does not depend on key_pe (later layers' inputs do)
    a, b, z = one[0], two[0], zero[0]
    assert abs(b["position_std"] - 2 * a["position_std"]) < 1e-4 * a["position_std"]
    assert a["content_std"] == b["content_std"] == z["content_std"] > 0
    for a, z in zip(one, zero, strict=True):
        assert z["position_std"] == 0 and z["position_share"] == 0
        assert 0.2 < a["position_share"] < 0.8  # N(0, 1): as large as the content term here
        for k in ("previous", "recall", "recall_next"):
            assert 0 <= a[k] <= 1

    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        run_quality(["mqar"], ["adaptive-span", "adaptive-span-pe0"], budget="smoke", out=out,
                    progress=False)  # fmt: skip
        cells = ["mqar/adaptive-span/T64/lr0.003/s0", "mqar/adaptive-span-pe0/T64/lr0.003/s0"]
        assert script.main(["--out", str(out), "--cells", *cells, "--sequences", "4"]) == 0
        assert script.main(["--out", str(out), "--cells", "mqar/nothing/T64/lr0.003/s0"]) == 2
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (out / "key_pe.jsonl").read_text().splitlines()]
    assert [(r["cell"], r["when"], r["layer"]) for r in rows] == [
        (c, w, 0) for c in cells for w in ("init", "trained")
    ]
    pe0_init = rows[2]
    assert pe0_init["position_std"] == 0 and pe0_init["test_accuracy"] is None
    assert rows[0]["position_share"] > 0.2 and rows[1]["test_accuracy"] is not None
    assert (out / "key_pe.md").read_text().count("\n") == 2 + len(rows)
