"""``benchmarks/lite_vs_dense_equal_time.py`` end to end at a tiny size: equal quiet time becomes
steps from the timing table, the lanes split the runs, each run is scored two ways (the last
checkpoint at beam 5; the average of the last checkpoints at beam 4), and the report reads it."""

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("keep_threads")  # the script sets one thread


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_equal_time_runs_lanes_two_scorings_latency_and_report(tmp_path, shared_data, bench_script):
    data = shared_data("multi30k")
    script = bench_script("lite_vs_dense_equal_time")
    out, runs = tmp_path / "out", tmp_path / "runs"
    common = ["--data", str(data), "--out", str(out), "--runs", str(runs), "--lite-dims", "32",
              "--vocab-size", "800", "--max-tokens", "300", "--eval-sentences", "4",
              "--test-sentences", "6", "--average", "2", "--warmup", "2"]  # fmt: skip
    plan = script.runs_of([32], 2)
    assert [r["name"] for r in plan][:2] == ["lite-d32-s0", f"dense-d{plan[1]['dim']}-s0"]
    assert [r["seed"] for r in plan] == [0, 0, 1, 1]
    # a timing table as the time phase writes it, with made-up step times: steps follow from it
    out.mkdir()
    step_s = {"lite-d32": 1.0, f"dense-d{plan[1]['dim']}": 0.5}
    (out / "timing.json").write_text(json.dumps({k: {"step_s": v} for k, v in step_s.items()}))
    assert script.main([*common, "--phase", "train", "--lane", "1/2", "--equal-time", "4"]) == 0
    done = [r for r in _records(out / "results.jsonl") if r["kind"] == "run"]
    assert [r["name"] for r in done] == [plan[1]["name"], plan[3]["name"]]  # lane 1: dense only
    assert script.main([*common, "--phase", "train", "--lane", "0/2", "--equal-time", "4"]) == 0
    assert script.main([*common, "--phase", "train", "--lane", "0/2", "--equal-time", "4"]) == 0
    runs_done = [r for r in _records(out / "results.jsonl") if r["kind"] == "run"]
    assert len(runs_done) == 4  # the second lane-0 call found its runs recorded: none again
    for r in runs_done:
        assert r["steps"] == round(4 / step_s[f"{r['family']}-d{r['dim']}"])
        assert r["quiet_train_s"] == pytest.approx(4.0)
        assert r["test_last"]["beam"] == 5 and r["test_avg"]["beam"] == 4
        assert r["test_avg"]["averaged"] == 2 and r["test_last"]["sentences"] == 6
        assert [c["step"] for c in r["curve"]] == list(range(1, r["steps"] + 1))  # every tenth
        assert (runs / f"{r['name']}-avg2" / "latest").exists()
    # the averaged run holds the mean of the last two checkpoints' weights
    from effiformer.checkpoint import load_checkpoint

    name = runs_done[0]["name"]
    steps = runs_done[0]["steps"]
    a, _ = load_checkpoint(runs / name / f"step-{steps - 1:08d}")
    b, _ = load_checkpoint(runs / name / f"step-{steps:08d}")
    m, _ = load_checkpoint(runs / f"{name}-avg2")
    for (k, x), y, z in zip(a.state_dict().items(), b.state_dict().values(),
                            m.state_dict().values()):  # fmt: skip
        if x.is_floating_point():
            torch.testing.assert_close(z, (x.double() + y.double()).div(2).float(), msg=k)
    assert script.main([*common, "--phase", "latency", "--latency-runs", "1"]) == 0
    lat = [r for r in _records(out / "results.jsonl") if r["kind"] == "latency"]
    assert sorted(r["name"] for r in lat) == sorted(r["name"] for r in runs_done)
    assert all(r["latency_ms"] > 0 and r["threads"] == 1 for r in lat)
    assert script.main([*common, "--phase", "report", "--equal-time", "4"]) == 0
    table = (out / "table.md").read_text()
    head, pairs = table.split("\n\n")
    assert "lite-d32" in head and head.count("\n") == 2 + 1  # header, rule, two models
    (pair,) = [x for x in pairs.splitlines() if x.startswith("| lite-d32 vs dense-d")]
    assert "per seed" in pair  # two seeds of the smallest pair: each seed's difference
    for png in ("bleu_vs_mult_adds.png", "bleu_vs_time.png", "bleu_vs_latency.png"):
        assert (out / png).stat().st_size > 1000


def test_bad_lane_is_refused_in_one_line(tmp_path, shared_data, bench_script, capsys):
    data = shared_data("multi30k")
    script = bench_script("lite_vs_dense_equal_time")
    with pytest.raises(SystemExit) as e:
        script.main(["--data", str(data), "--out", str(tmp_path), "--phase", "train",
                     "--lane", "2/2"])  # fmt: skip
    assert e.value.code == 2
    assert "--lane must be I/N with 0 <= I < N, got '2/2'" in capsys.readouterr().err
