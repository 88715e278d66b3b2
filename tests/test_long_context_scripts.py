"""The long-context scripts (issue 25) on a seconds-long equal-compute run: the report reads the
records and the timings into its table and plot, and the evaluation-memory script scores the
trained XL and Compressive models with scaled memory (weights unchanged), resuming what it has."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from effiformer.bench.quality import run_quality

ROOT = Path(__file__).resolve().parents[1]


def test_report_and_memory_curves_from_an_equal_compute_run(tmp_path, shared_data, bench_script):
    shared_data("ptb")
    out = tmp_path / "lc"
    threads = torch.get_num_threads()
    try:
        recs = run_quality(["lm-ptb"], ["dense", "xl", "compressive"], budget="smoke", out=out,
                           data=shared_data.root, progress=False, plot=False, equal_time=0.3)  # fmt: skip
        assert [r["status"] for r in recs] == ["ok"] * 3
        text = bench_script("long_context_report").report(out)
        timing = json.loads((out / "timing.json").read_text())
        for r in recs:
            key = f"lm-ptb/{r['mechanism']}/T64"
            row = next(
                line for line in text.splitlines() if line.startswith(f"| {r['mechanism']} |")
            )
            assert f"| {r['steps']:,} |" in row and f"{r['valid']:.3f} (1)" in row
            assert r["equal_time"]["step_s_quiet"] == timing[key]["step_s"]
        assert (out / "equal_compute.md").is_file() and (out / "equal_compute.png").is_file()
        memory = bench_script("long_context_memory")
        argv = ["--out", str(out), "--data", str(shared_data.root), "--eval-tokens", "1024"]
        assert memory.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (out / "memory_eval.jsonl").read_text().splitlines()]
    # XL: 0.5x, 1x, 2x (+ clamped), 4x (+ clamped); the same for Compressive
    assert len(rows) == 12 and {r["mechanism"] for r in rows} == {"xl", "compressive"}
    xl = {(r["factor"], r["clamp_len"]): r for r in rows if r["mechanism"] == "xl"}
    assert xl[(2.0, None)]["mem_len"] == 2 * xl[(1.0, None)]["mem_len"] == 64
    assert xl[(4.0, 64)]["clamp_len"] == 64  # segment 32 + memory 32: the training context
    assert all(1.0 < r["valid_bpc"] < 9.0 for r in rows)
    before = (out / "memory_eval.jsonl").read_text()
    assert memory.main(argv) == 0  # resumes: nothing scored again
    assert (out / "memory_eval.jsonl").read_text() == before
    assert "| xl s0" in (out / "memory_eval.md").read_text()
