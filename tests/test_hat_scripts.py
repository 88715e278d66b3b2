"""The HAT benchmark scripts run end to end at tiny sizes (nothing here is timed or compared; the
supernet / latency / search chain takes seconds, the others are marked slow)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hat-latency"


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _folder(d):
    words = {"man": "Mann", "dog": "Hund", "red": "rot", "big": "groß", "a": "ein"}
    keys = list(words)
    for split, n, seed in (("train", 120, 0), ("val", 10, 1), ("test_2016_flickr", 6, 2)):
        g = torch.Generator().manual_seed(seed)
        src, tgt = [], []
        for _ in range(n):
            w = [keys[int(i)] for i in torch.randint(0, len(keys), (3,), generator=g)]
            src.append(" ".join(w) + ".")
            tgt.append(" ".join(words[x] for x in w) + ".")
        (d / f"{split}.en").write_text("\n".join(src) + "\n")
        (d / f"{split}.de").write_text("\n".join(tgt) + "\n")
    return d


def test_supernet_latency_and_search_scripts(tmp_path, bench_script):
    data = _folder(tmp_path)
    sup = tmp_path / "super"
    assert bench_script("hat_supernet_multi30k").main([
        "--data", str(data), "--model", "hat-tiny", "--vocab-size", "80", "--steps", "3",
        "--max-tokens", "120", "--eval-sentences", "2", "--threads", "1", "--out", str(sup),
    ]) == 0  # fmt: skip
    final = json.loads((sup / "results.jsonl").read_text().splitlines()[-1])
    assert final["kind"] == "final" and final["step"] == 3
    lat = tmp_path / "lat"
    assert bench_script("hat_latency_multi30k").main([
        "--space", "tiny", "--n", "12", "--runs", "1", "--warmup", "0", "--vocab-size", "64",
        "--src-len", "6", "--steps", "30", "--out", str(lat),
    ]) == 0  # fmt: skip
    rec = json.loads((lat / "predictor.json").read_text())
    assert rec["rows"] == 12 and "macs_linear" in rec["test"]
    out = tmp_path / "search"
    common = [
        "--super", str(sup), "--predictor", str(lat / "predictor.pt"), "--limits", "1e6",
        "--data", str(data), "--iterations", "1", "--population", "6", "--parents", "2",
        "--mutations", "2", "--crossovers", "2", "--fitness-sentences", "4",
        "--test-sentences", "3", "--runs", "1", "--warmup", "0", "--eval-sentences", "2",
        "--dense", "n_layers=1 decoder_layers=1 dim=32 n_heads=2 ffn_dim=64", "--quiet",
        "--inherited-bleu",
    ]  # fmt: skip
    script = bench_script("hat_search_multi30k")
    assert script.main([*common, "--train-steps", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds == ["environment", "search", "latency", "latency", "trained", "trained"]
    assert rows[1]["best_predicted_ms"] <= 1e6 and "inherited" in rows[1]
    trained = rows[4:]
    assert [r["name"] for r in trained] == ["hat-1e+06-s0", "dense-0-s0"]
    assert all(r["measured_ms"] > 0 and "bleu" in r and r["steps"] == 2 for r in trained)
    assert trained[0]["inherited"] == rows[1]["inherited"]
    for png in ("bleu_vs_latency.png", "search.png"):
        assert (out / png).is_file()
    # one fitness per distinct SubTransformer, kept for the other limits and for a resume
    fits = [json.loads(x) for x in (out / "fitness.jsonl").read_text().splitlines()]
    assert fits and len({f["sub"] for f in fits}) == len(fits)
    search = json.loads((out / "search_1e+06.json").read_text())
    assert len(fits) == len(search["evaluated"])
    table = (out / "table.md").read_text()
    assert "| hat | 1000000.0 |" in table and "| dense | - |" in table
    # Rerun of the same folder with the inherited-vs-scratch anchors: what was recorded is not
    # searched, trained or measured again; only the anchors are added.
    assert script.main([*common, "--train-steps", "2", "--anchors", "--out", str(out)]) == 0
    again = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert again[:6] == rows
    assert [r["kind"] for r in again[6:]] == ["environment"] + ["anchor_inherited"] * 2 + [
        "latency"
    ] * 2 + ["trained"] * 2
    assert again[6]["resumed"]
    anchors = again[-2:]
    assert [r["name"] for r in anchors] == ["anchor-largest-s0", "anchor-smallest-s0"]
    assert all("bleu" in r["inherited"] and r["steps"] == 2 for r in anchors)
    assert "| anchor |" in (out / "table.md").read_text()
    # --remeasure: every model's latency again in interleaved rounds; the table shows the median
    n_before = len(_rows(out))
    assert script.main([*common, "--train-steps", "2", "--anchors", "--remeasure", "2",
                        "--no-train", "--out", str(out)]) == 0  # fmt: skip
    assert {r["kind"] for r in _rows(out)[n_before:]} == {"environment", "remeasure"}
    re = [r for r in _rows(out) if r["kind"] == "remeasure"]
    groups = ["anchor-largest", "anchor-smallest", "hat-1e+06", "dense-0"]
    assert [(r["group"], r["round"]) for r in re] == [(g, k) for k in (0, 1) for g in groups]
    assert ", 3) |" in (out / "table.md").read_text()  # three measurements per model
    # Equal compute: each model timed (the other lane paused meanwhile), its steps = the budget
    # over its quiet step time; two seeds at the lowest limit; --only trains one job.
    lane = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        eq = tmp_path / "equal"
        argv = [*common, "--equal-compute", "0.5", "--timing-steps", "2", "--smallest-seeds",
                "2", "--pause", str(lane.pid), "--out", str(eq)]  # fmt: skip
        assert script.main([*argv, "--plan-only"]) == 0
        assert _state(lane.pid) != "T"  # continued after the measurements
        timing = json.loads((eq / "timing.json").read_text())
        assert set(timing) == {"hat-1e+06", "dense-0"}
        assert all(t["paused"] == [lane.pid] and t["steps_timed"] == 2 for t in timing.values())
        plan = json.loads((eq / "plan.json").read_text())
        names = [j["name"] for j in plan["jobs"]]
        assert names == ["hat-1e+06-s0", "hat-1e+06-s1", "dense-0-s0"]
        for j in plan["jobs"]:
            assert j["steps"] == max(1, int(0.5 / timing[j["group"]]["step_s"]))
        assert not [r for r in _rows(eq) if r["kind"] == "trained"]
        assert script.main([*argv, "--only", "hat-1e+06-s1"]) == 0
        done = [r for r in _rows(eq) if r["kind"] == "trained"]
        assert [r["name"] for r in done] == ["hat-1e+06-s1"] and done[0]["seed"] == 1
        assert done[0]["steps"] == plan["jobs"][1]["steps"]
        assert "Not trained yet: hat-1e+06-s0, dense-0-s0." in (eq / "table.md").read_text()
        assert (eq / "loss_vs_time.png").is_file()  # the trained job's curve (it has a step_s)
        with pytest.raises(SystemExit):
            script.main([*argv, "--only", "hat-7-s0"])
        # --dense-only: no search (a lane that starts before the SuperTransformer is trained)
        solo = tmp_path / "solo"
        assert script.main([*argv[:-1], str(solo), "--dense-only", "--plan-only"]) == 0
        plan = json.loads((solo / "plan.json").read_text())
        assert [j["name"] for j in plan["jobs"]] == ["dense-0-s0"]
        assert not list(solo.glob("search_*.json"))
    finally:
        lane.kill()
        lane.wait()
    # --dense auto: for each limit, the measured scaling with the largest latency under it
    script.DENSE_GRID = ["n_layers=1 decoder_layers=1 dim=32 n_heads=2 ffn_dim=64",
                         "n_layers=2 decoder_layers=2 dim=64 n_heads=2 ffn_dim=128"]  # fmt: skip

    class Args:
        runs, warmup, threads = 1, 0, 1

    with (tmp_path / "grid.jsonl").open("w") as log:
        picked = script._dense_for_limits([1e6, 1e-9], 80, Args, log)
    grid = json.loads((tmp_path / "grid.jsonl").read_text())
    assert grid["kind"] == "dense_grid" and len(grid["measured"]) == 2
    # under 1e6 ms: the slowest; under 1e-9: none
    assert picked == [max(grid["measured"])[1], None]


def _rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow
def test_beyond_script(tmp_path, bench_script):
    out = tmp_path / "beyond"
    assert bench_script("hat_beyond").main([
        "--family", "local", "--model", "vanilla-tiny", "--choices", "attention.window=16,32",
        "n_layers=1,2",
        "--seq-len", "64", "--n", "12", "--runs", "1", "--warmup", "0", "--steps", "30",
        "--population", "5", "--iterations", "2", "--limits", "1e6", "--out", str(out),
    ]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["environment", "dataset", "predictor", "search"]
    assert rows[-1]["measured_ms"] > 0 and rows[-1]["best"]["n_layers"] in (1, 2)


@pytest.mark.slow
@pytest.mark.skipif(not DATA.is_dir(), reason="HAT's latency files are not in ../shared/data")
def test_predictor_released_script(tmp_path, bench_script):
    assert bench_script("hat_predictor_released").main([
        "--data", str(DATA), "--devices", "xeon", "--steps", "20", "--out", str(tmp_path),
    ]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows[1]["device"] == "xeon" and rows[1]["split"] == [1600, 200, 200]


def test_paused_stops_a_whole_process_group_and_continues_it(bench_script):
    """A lane whose cells run in child processes: the group stops, then continues; this
    process's own group is never stopped."""
    bench_script("_data")  # puts benchmarks/ on sys.path for the helper modules
    quiet = bench_script("_quiet")
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); time.sleep(60)"
    )
    lane = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        for _ in range(100):  # the child is up
            kids = Path(f"/proc/{lane.pid}/task/{lane.pid}/children").read_text().split()
            if kids:
                break
            time.sleep(0.05)
        child = int(kids[0])
        with quiet.paused([lane.pid], group=True) as stopped:
            assert stopped == [lane.pid]  # the session leader's group
            assert _state(lane.pid) == "T" and _state(child) == "T"
        assert _state(lane.pid) != "T" and _state(child) != "T"
        with quiet.paused([os.getpid()], group=True) as stopped:
            assert stopped == []  # its own group: left running
    finally:
        os.killpg(lane.pid, signal.SIGKILL)
        lane.wait()


def test_beyond_sparse_family_quality_at_equal_compute(tmp_path, bench_script, shared_data):
    """The sparse family: a limit named by a quality row (the row's model measured here), the
    chosen configuration trained on the row's task for steps(row) * step(row) / step(chosen),
    the table with both; a rerun skips what is recorded."""
    shared_data("ptb")
    src = tmp_path / "quality"
    src.mkdir()
    (src / "quality.json").write_text(json.dumps({"budget": {"name": "smoke"}}))
    refs = [{"task": "lm-ptb", "mechanism": m, "length": 64, "status": "ok", "lr": 3e-3,
             "steps": n, "valid": v, "test": v + 0.1}
            for m, n, v in (("sparse-strided", 6, 5.0), ("dense", 4, 4.0))]  # fmt: skip
    (src / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in refs))
    out = tmp_path / "beyond"
    argv = ["--family", "sparse", "--budget", "smoke", "--seq-len", "64", "--n", "10",
            "--runs", "1", "--warmup", "0", "--steps", "20", "--population", "5",
            "--iterations", "1", "--choices", "attention.stride=8,16", "attention.pattern=strided,fixed",
        "attention.summary=2,4", "n_layers=1,2",
            "--limits", "1e6", "dense", "--quality-from", str(src),
            "--data", str(shared_data.root), "--out", str(out)]  # fmt: skip
    script = bench_script("hat_beyond")
    assert script.main(argv) == 0
    rows = _rows(out)
    (dense_ref,) = [r for r in rows if r["kind"] == "reference"]
    assert dense_ref["row"] == "dense" and dense_ref["measured_ms"] > 0
    searches = {r["limit"]: r for r in rows if r["kind"] == "search"}
    infeasible = {r["limit"] for r in rows if r["kind"] == "infeasible"}
    assert "1e6" in searches and set(searches) | infeasible == {"1e6", "dense"}
    assert set(searches["1e6"]["best"]) == {
        "attention.stride",
        "attention.pattern",
        "attention.summary",
        "n_layers",
    }
    timings = {r["limit"]: r for r in rows if r["kind"] == "timing"}
    quality = {r["limit"]: r for r in rows if r["kind"] == "quality"}
    assert set(timings) == set(quality) == set(searches)
    for limit, q in quality.items():
        row = "sparse-strided" if limit == "1e6" else "dense"  # a number: the family's row
        t = timings[limit]
        assert q["row"] == t["row"] == row
        ref_steps = 6 if row == "sparse-strided" else 4
        ratio = t["reference"]["step_s"] / t["chosen"]["step_s"]
        assert q["steps"] == max(1, math.floor(ref_steps * ratio)) and q["steps_done"] == q["steps"]
        assert q["reference_valid"] == [5.0 if row == "sparse-strided" else 4.0]
        assert math.isfinite(q["valid"]) and math.isfinite(q["test"])
        assert q["best"] == searches[limit]["best"]
    table = (out / "table.md").read_text()
    assert "| 1e6 | searched |" in table and "| 1e6 | sparse-strided (the table's row) |" in table
    # a rerun measures and trains nothing again
    assert script.main(argv) == 0
    again = _rows(out)[len(rows) :]
    assert not {r["kind"] for r in again} & {"search", "reference", "timing", "quality"}


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--limits", "sparse-stridd"], "unknown limit(s) ['sparse-stridd']"),
        (["--limits", "1e6", "--budget", "cpu-longg"], "invalid choice: 'cpu-longg'"),
        (["--family", "local", "--limits", "dense"], "need --family sparse"),
        (["--limits", "1e6", "--quality-from", "NOWHERE"], "no quality.json"),
        (["--limits", "dense", "--quality-limits", "1e6"], "are not among --limits"),
    ],
)
def test_beyond_bad_input_is_one_line_before_any_work(extra, says, tmp_path, capsys,
                                                      bench_script, shared_data):  # fmt: skip
    if "--quality-limits" in extra:  # a quality run's folder and its data, to reach that check
        shared_data("ptb")
        extra = [*extra, "--data", str(shared_data.root)]
        (tmp_path / "q").mkdir()
        (tmp_path / "q" / "quality.json").write_text("{}")
        extra = [*extra, "--quality-from", str(tmp_path / "q")]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        bench_script("hat_beyond").main([*extra, "--out", str(out)])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not out.exists()  # nothing measured, nothing written
