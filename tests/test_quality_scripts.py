"""benchmarks/mqar_by_length.py: a recorded MQAR cell scored again at the lengths of its ladder
from its checkpoint (tiny sizes, fixed steps: nothing here is timed)."""

import json

import torch

from effiformer.bench.quality import run_quality


def test_mqar_by_length_scores_a_smoke_cell_at_each_ladder_length(tmp_path, bench_script):
    script = bench_script("mqar_by_length")
    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        recs = run_quality(["mqar", "duplication"], ["dense"], budget="smoke", out=out,
                           progress=False)  # fmt: skip
        mqar = next(r for r in recs if r["task"] == "mqar")
        dup = next(r for r in recs if r["task"] == "duplication")
        argv = ["--out", str(out), "--min-len", "16", "--cells"]
        # refusals: one line, exit 2, nothing written
        assert script.main([*argv, "mqar/dense/T64/lr0.1/s0"]) == 2
        assert script.main([*argv, mqar["cell"], dup["cell"]]) == 2  # not an MQAR cell
        assert script.main(["--out", str(out), "--min-len", "48", "--cells", mqar["cell"]]) == 2
        assert not (out / "by_length.jsonl").exists()
        assert script.main([*argv, mqar["cell"]]) == 0
        # a second cell's row is added; the first one's stays
        with open(out / "by_length.jsonl", "a") as f:
            f.write(json.dumps({"cell": "other", "mechanism": "x", "test": {"16": 0.5}}) + "\n")
        assert script.main([*argv, mqar["cell"]]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (out / "by_length.jsonl").read_text().splitlines()]
    assert [r["cell"] for r in rows] == [mqar["cell"], "other"]
    acc = rows[0]["test"]
    assert list(acc) == ["16", "32", "64"] and all(0.0 <= v <= 1.0 for v in acc.values())
    assert acc["64"] == mqar["test"]  # at its own length: the suite's own test set
    assert len(set(acc.values())) > 1  # other lengths are other test sets
    md = (out / "by_length.md").read_text()
    assert "| T=16 | T=32 | T=64 |" in md and f"{100 * mqar['test']:.1f}%" in md


def test_relative_xl_position_share_is_zero_only_for_the_zero_started_ablation(
    tmp_path, bench_script
):
    script = bench_script("relative_xl_position_share")
    threads = torch.get_num_threads()
    argv = ["--budget", "smoke", "--length", "64"]
    q = tmp_path / "q"
    try:
        (rec,) = run_quality(["mqar"], ["relative-xl"], budget="smoke", out=q, progress=False)
        assert script.main(["--out", str(tmp_path / "no"), *argv, "--mechanisms", "dense"]) == 2
        assert script.main(["--out", str(tmp_path / "no"), *argv, "--trained", f"{q}:nothing"]) == 2
        assert not (tmp_path / "no").exists()  # refused before anything is written
        trained = ["--trained", f"{q}:{rec['cell']}"]
        assert script.main(["--out", str(tmp_path / "ps"), *argv, *trained]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [
        json.loads(x) for x in (tmp_path / "ps" / "position_share.jsonl").read_text().splitlines()
    ]
    (after,) = [r for r in rows if r["weights"] != "init"]
    assert after["cell"] == rec["cell"] and after["weights"].startswith("trained (step-")
    by = {r["mechanism"]: r for r in rows if r["weights"] == "init"}
    assert set(by) == {"relative-xl", "relative-xl-r0"}
    assert after["share"] != by["relative-xl"]["share"]  # trained weights, another sequence
    assert 0.1 < by["relative-xl"]["share"] < 0.9 and by["relative-xl"]["content_var"] > 0
    assert by["relative-xl-r0"]["share"] == 0.0 and by["relative-xl-r0"]["content_var"] > 0
    assert (
        "| relative-xl-r0 | 64 | init | 0 |" in (tmp_path / "ps" / "position_share.md").read_text()
    )
