"""The Reformer benchmark scripts run end to end at tiny sizes and record what docs/reformer.md
reads from them (fixed steps: nothing here is timed)."""

import json
from pathlib import Path

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
