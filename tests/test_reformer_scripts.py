"""The Reformer benchmark scripts run end to end at tiny sizes and record what docs/reformer.md
reads from them (fixed steps: nothing here is timed)."""

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_duplication_script_trains_lsh_1_and_evaluates_several_hash_counts(tmp_path, bench_script):
    threads = torch.get_num_threads()
    try:
        assert bench_script("reformer_duplication").main([
            "--seq-len", "32", "--vocab", "8", "--dim", "32", "--heads", "2", "--chunk-len", "4",
            "--steps", "3", "--batch", "4", "--eval-sequences", "4", "--eval-hashes", "1", "2",
            "--threads", "1", "--out", str(tmp_path),
        ]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    lines = _lines(tmp_path / "results.jsonl")
    assert [r["kind"] for r in lines] == ["environment", "train", "eval", "eval"]
    assert lines[1]["trained"] == "lsh-1" and lines[1]["steps"] == 3
    assert [r["evaluated"] for r in lines[2:]] == ["lsh-1", "lsh-2"]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["tokens"] == 4 * 15 for r in lines[2:])


def test_lm_vs_dense_script_records_every_model(tmp_path, data_env, bench_script):
    data_env("tinyshakespeare/input.txt")  # the script's corpus, resolved when it is loaded
    threads = torch.get_num_threads()
    try:
        assert bench_script("reformer_lm_vs_dense").main([
            "--steps", "2", "--seq-len", "32", "--batch", "2", "--eval-tokens", "200",
            "--eval-batch", "2", "--threads", "1", "--out", str(tmp_path),
            "--set", "dim=32", "n_heads=2", "n_layers=1", "ffn_dim=64",
        ]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    lines = _lines(tmp_path / "results.jsonl")
    records = {r["model"]: r for r in lines[1:]}
    assert set(records) == {"vanilla-small", "reformer-small", "vanilla-small+lsh"}
    for r in records.values():
        assert r["steps"] == 2 and r["val_bpc"] > 0 and r["val_tokens"] > 100
    assert records["vanilla-small+lsh"]["overrides"]["attention"]["name"] == "lsh"


def test_lsh_hash_counts_scores_a_recorded_mqar_cell_again(tmp_path, bench_script):
    """benchmarks/lsh_hash_counts.py: an LSH MQAR cell recorded without hash counts (as the suite
    recorded them before it scored every LSH cell) gets them from its checkpoint, appended as the
    cell's last record, and the table prints them; refusals are one line, nothing written."""
    from effiformer.bench.quality import _read_results, run_quality

    script = bench_script("lsh_hash_counts")
    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        (rec,) = run_quality(["mqar"], ["lsh"], budget="smoke", out=out,
                             progress=False)  # fmt: skip
        assert set(rec["hash_evals"]) == {"hashes_1", "hashes_2", "hashes_4", "hashes_8", "full"}
        old = {k: v for k, v in rec.items() if k != "hash_evals"}  # as recorded before
        (out / "results.jsonl").write_text(json.dumps(old) + "\n")
        (out / "table.md").write_text("")
        cell = rec["cell"]
        assert script.main(["--out", str(out), "--cells", "mqar/lsh/T64/lr0.1/s0"]) == 2
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps({**old, "cell": "mqar/dense/T64/lr0.003/s0",
                                "mechanism": "dense"}) + "\n")  # fmt: skip
        before = (out / "results.jsonl").read_text()
        assert script.main(["--out", str(out), "--cells", cell, "mqar/dense/T64/lr0.003/s0"]) == 2
        assert (out / "results.jsonl").read_text() == before  # refused before scoring anything
        assert script.main(["--out", str(out), "--cells", cell]) == 0
    finally:
        torch.set_num_threads(threads)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0]) == old
    new = _read_results(out / "results.jsonl")[cell]
    assert {k: v for k, v in new.items() if k not in ("hash_evals", "hash_evals_from")} == old
    h = new["hash_evals"]
    assert set(h) == {"hashes_1", "hashes_2", "hashes_4", "hashes_8", "full"}
    assert all(0.0 <= v <= 1.0 for v in h.values())
    assert new["hash_evals_from"]["checkpoint"].startswith("step-")
    assert new["hash_evals_from"]["test_reloaded"] == pytest.approx(rec["test"], abs=0.1)
    assert "LSH-trained models" in (out / "table.md").read_text()
