"""The quality suite (``effiformer bench --part quality``): a seconds-long end-to-end run, resume
that skips finished cells, diverged cells recorded, and bad input refused in one line with nothing
already written lost."""

from __future__ import annotations

import dataclasses
import json

import pytest

from effiformer.bench.quality import (
    BUDGETS,
    MECHANISMS,
    TASKS,
    fits,
    format_quality_table,
    mechanism_settings,
    run_quality,
    run_quality_cell,
)
from effiformer.cli import main


def _records(out):
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("budget", ["cpu", "gpu"])
def test_every_mechanism_builds_for_every_task_it_fits_at_every_length(budget):
    from effiformer.bench.quality import _make_cell, check_cell

    b = BUDGETS[budget]
    for task, tb in b.tasks.items():
        for m in MECHANISMS:
            if not fits(m, task):
                continue
            for n in tb.lengths:
                check_cell(_make_cell(b, task, m, n, 1e-3, 0, None, data=None))


def test_settings_follow_the_papers_rules_for_the_length():
    assert mechanism_settings("sparse-strided", "mqar", 256)["stride"] == 16  # ~ sqrt(T)
    assert mechanism_settings("sparse-fixed", "mqar", 1024) == {
        "name": "sparse", "pattern": "fixed", "stride": 32, "summary": 8}  # fmt: skip
    assert mechanism_settings("adaptive-span", "mqar", 512)["max_span"] == 512
    assert mechanism_settings("local", "mqar", 1024)["window"] == 32
    assert mechanism_settings("local", "lm-ptb", 1024)["window"] == 128
    assert mechanism_settings("xl", "lm-ptb", 1024) is None
    assert not fits("adaptive-span", "listops") and fits("funnel", "listops")
    assert not fits("funnel", "mqar") and fits("xl", "lm-ptb") and not fits("xl", "mqar")
    # ablations run only when named
    from effiformer.bench.quality import plan_cells

    pairs, _ = plan_cells(BUDGETS["cpu"], ["duplication"])
    assert "adaptive-span-full" not in {m for _, m in pairs} and ("duplication", "dense") in pairs
    pairs, _ = plan_cells(BUDGETS["cpu"], ["duplication"], ["adaptive-span-full"])
    assert pairs == [("duplication", "adaptive-span-full")]
    assert mechanism_settings("adaptive-span-full", "duplication", 256)["init_span"] == 1.0
    assert mechanism_settings("adaptive-span-self", "mqar", 64)["include_self"] is True
    assert "include_self" not in mechanism_settings("adaptive-span", "mqar", 64)
    assert mechanism_settings("adaptive-span-pe0", "mqar", 64)["key_pe_std"] == 0.0
    assert mechanism_settings("routing-mute", "lm-ptb", 1024)["mute_routed"] is True
    assert "mute_routed" not in mechanism_settings("routing", "lm-ptb", 1024)
    assert mechanism_settings("relative-xl-r0", "mqar", 1024)["r_init_std"] == 0.0
    assert "r_init_std" not in mechanism_settings("relative-xl", "mqar", 1024)
    assert mechanism_settings("dense-nobias", "mqar", 1024) == {"name": "dense", "bias": False}
    bridge = mechanism_settings("adaptive-span-dense", "mqar", 64)
    assert (bridge["init_span"], bridge["include_self"], bridge["penalty"]) == (1.0, True, 0.0)


def test_smoke_run_end_to_end_then_resume_skips_finished_cells(tmp_path):
    out = tmp_path / "q"
    seen = []
    recs = run_quality(["mqar", "duplication", "listops"], ["dense", "lsh", "funnel"],
                       budget="smoke", out=out, progress=False, on_record=seen.append)  # fmt: skip
    cells = {r["cell"] for r in recs}
    assert cells == {
        "mqar/dense/T64/lr0.003/s0", "mqar/lsh/T64/lr0.003/s0",
        "duplication/dense/T64/lr0.003/s0", "duplication/lsh/T64/lr0.003/s0",
        "listops/dense/T32/lr0.003/s0", "listops/lsh/T32/lr0.003/s0",
        "listops/funnel/T32/lr0.003/s0",
    }  # fmt: skip
    assert all(r["status"] == "ok" for r in recs), [r.get("error") for r in recs]
    for r in recs:
        assert 0.0 <= r["test"] <= 1.0 and r["steps_done"] == 6 and r["params"] > 0
        assert r["curve"] and r["curve"][-1][0] == 6
    lsh = next(r for r in recs if r["cell"].startswith("duplication/lsh"))
    assert set(lsh["hash_evals"]) == {"hashes_1", "hashes_2", "hashes_4", "hashes_8", "full"}
    table = (out / "table.md").read_text()
    assert "### mqar" in table and "### listops" in table and "| funnel |" in table
    assert "Majority class" in table and "LSH-trained models" in table
    assert (out / "results.jsonl").read_text().count("\n") == 7
    # a rerun resumes: nothing runs again
    seen.clear()
    again = run_quality(["mqar", "duplication", "listops"], ["dense", "lsh", "funnel"],
                        budget="smoke", out=out, progress=False, on_record=seen.append)  # fmt: skip
    assert seen == [] and {r["cell"] for r in again} == cells
    # a run killed mid-table: drop two finished records (and a line cut by the kill)
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])
    run_quality(["mqar", "duplication", "listops"], ["dense", "lsh", "funnel"],
                budget="smoke", out=out, progress=False, on_record=seen.append)  # fmt: skip
    assert sorted(r["cell"] for r in seen) == sorted(json.loads(x)["cell"] for x in lines[5:])


def test_a_diverging_cell_is_recorded_as_diverged(tmp_path):
    from effiformer.bench.quality import _make_cell

    cell = _make_cell(BUDGETS["smoke"], "mqar", "dense", 64, 1e30, 0, 6, data=None, out=tmp_path)
    cell["warmup"] = 1
    rec = run_quality_cell(cell)
    assert rec["status"] == "diverged" and "nan" in rec["diverged"]
    table = format_quality_table([{**cell, **rec, "metric": "accuracy"}])
    assert "[1 diverged]" in table


def test_cli_smoke_prints_the_table(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["bench", "--part", "quality", "--budget", "smoke", "--tasks", "mqar",
                 "--attention", "dense", "local", "--out", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "| dense |" in printed and "| local |" in printed and "window=32" in printed
    assert (out / "mqar.png").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "mqr"], "unknown task 'mqr'; known (closest first): mqar"),
        (["--attention", "dens"], "unknown mechanism 'dens'; known (closest first): dense"),
        (
            ["--tasks", "listops", "--attention", "adaptive-span"],
            "mechanism 'adaptive-span' fits none of the tasks listops",
        ),
        (["--tasks", "duplication", "--lengths", "63"], "duplication needs an even length"),
        (
            ["--tasks", "mqar", "--attention", "dense", "--lengths", "4096"],
            "dense cannot run mqar at length 4096: 128 key-value pairs need 128 distinct keys",
        ),
        (
            ["--tasks", "mqar", "--attention", "dense", "--lengths", "4000"],
            "dense cannot run mqar at length 4000: train_min_len=64 must be seq_len=4000 divided",
        ),
        (
            ["--tasks", "lm-ptb", "--budget", "smoke", "--data", "/nonexistent"],
            "lm-ptb needs /nonexistent/ptb, which does not exist",
        ),
        (["--budget", "tpu"], "unknown budget 'tpu'"),
        (["vanilla-tiny"], "--part quality trains its own models; drop NAME"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "bad"
    code = main(["bench", "--part", "quality", "--out", str(out), "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_another_plan_in_the_same_folder_is_refused_and_nothing_is_lost(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["bench", "--part", "quality", "--budget", "smoke", "--tasks", "mqar",
                 "--attention", "dense", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    before = (out / "results.jsonl").read_text()
    capsys.readouterr()
    code = main(["bench", "--part", "quality", "--budget", "smoke", "--tasks", "mqar",
                 "--attention", "dense", "--steps", "3", "--out", str(out), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "another plan (steps differ)" in err
    assert (out / "results.jsonl").read_text() == before


def test_a_changed_budget_of_another_task_does_not_block_resuming(tmp_path, monkeypatch, capsys):
    """The plan is checked where this run's cells depend on it: a folder that ran MQAR resumes
    after the LM budget changed, and refuses once MQAR's own budget changed."""
    import dataclasses

    from effiformer.bench import quality

    out = tmp_path / "q"
    argv = ["bench", "--part", "quality", "--budget", "smoke", "--tasks", "mqar",
            "--attention", "dense", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    smoke = quality.BUDGETS["smoke"]
    lm = dataclasses.replace(smoke.tasks["lm-ptb"], steps=5)
    monkeypatch.setitem(quality.BUDGETS, "smoke", dataclasses.replace(
        smoke, tasks={**smoke.tasks, "lm-ptb": lm}))  # fmt: skip
    assert main(argv) == 0  # the finished cell is skipped, nothing refused
    saved = json.loads((out / "quality.json").read_text())
    assert saved["budget"]["tasks"]["lm-ptb"]["steps"] == 4  # not this run's task: kept
    mq = dataclasses.replace(smoke.tasks["mqar"], steps=7)
    monkeypatch.setitem(quality.BUDGETS, "smoke", dataclasses.replace(
        smoke, tasks={**smoke.tasks, "mqar": mq}))  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    assert "another plan (mqar's budget differ)" in capsys.readouterr().err


def test_a_folder_saved_before_a_budget_field_existed_resumes(tmp_path, capsys):
    """A manifest written before a ``TaskBudget`` field existed (here ``segment``) reads that
    field as its default and resumes; a saved value other than the default still refuses."""
    out = tmp_path / "q"
    argv = ["bench", "--part", "quality", "--budget", "smoke", "--tasks", "mqar",
            "--attention", "dense", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    path = out / "quality.json"
    saved = json.loads(path.read_text())
    del saved["budget"]["tasks"]["mqar"]["segment"]  # as a folder from before the field
    path.write_text(json.dumps(saved))
    n = len((out / "results.jsonl").read_text().splitlines())
    assert main(argv) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == n  # nothing retrained
    saved["budget"]["tasks"]["mqar"]["segment"] = 16
    path.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main(argv) == 2
    assert "another plan (mqar's budget differ)" in capsys.readouterr().err


def test_quality_flags_are_refused_outside_quality(capsys):
    assert main(["bench", "--tasks", "mqar"]) == 2
    assert "--tasks only apply to --part quality" in capsys.readouterr().err


def _fake(task, mech, length, lr, seed, valid, *, steps=100, train_s=10.0, status="ok"):
    return {"cell": f"{task}/{mech}/T{length}/lr{lr:g}/s{seed}", "task": task, "mechanism": mech,
            "length": length, "lr": lr, "seed": seed, "status": status, "valid": valid,
            "steps_done": steps, "train_s": train_s}  # fmt: skip


def test_plan_counts_the_sweep_then_the_seeds_at_its_best_rate(tmp_path, capsys):
    from effiformer.bench.quality import format_quality_plan, quality_plan

    budget = dataclasses.replace(BUDGETS["cpu"], tasks={
        "duplication": dataclasses.replace(BUDGETS["cpu"].tasks["duplication"], steps=400),
        "listops": BUDGETS["cpu"].tasks["listops"]})  # fmt: skip
    out = tmp_path / "q"
    out.mkdir()
    recs = [
        # dense: the whole sweep (3e-3 best) and seed 1 at 3e-3; seed 2 left
        _fake("duplication", "dense", 256, 1e-3, 0, 0.5),
        _fake("duplication", "dense", 256, 3e-3, 0, 0.9),
        _fake("duplication", "dense", 256, 1e-2, 0, 0.1),
        _fake("duplication", "dense", 256, 3e-3, 1, 0.9, train_s=30.0),
        # a seed at a rate the sweep did not choose does not count
        _fake("duplication", "dense", 256, 1e-3, 1, 0.5),
        # local: one rate of the sweep; its seeds wait for the rest of it
        _fake("duplication", "local", 256, 1e-3, 0, 0.4),
    ]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = quality_plan(["duplication", "listops"], ["dense", "local", "lsh"], budget=budget,
                        out=out)  # fmt: skip
    by = {(r["task"], r["mechanism"]): r for r in rows}
    assert [r["task"] for r in rows] == ["duplication"] * 3 + ["listops"] * 3  # grouped by task
    dense = by["duplication", "dense"]
    # 3 sweep cells + 3 seeds, the sweep's seed-0 cell at the best rate counted once
    assert (dense["planned"], dense["recorded"], dense["to_run"], dense["waiting"]) == (5, 4, 1, 0)
    assert dense["best_lr"] == 3e-3
    # seconds per step of its recorded cells: mean of 0.1 (x4) and 0.3, times 400 steps
    assert dense["estimate_s"] == pytest.approx(400 * (4 * 0.1 + 0.3) / 5)
    local = by["duplication", "local"]
    assert (local["planned"], local["recorded"], local["to_run"], local["waiting"]) == (5, 1, 2, 2)
    assert local["best_lr"] is None and local["estimate_s"] == pytest.approx(4 * 0.1 * 400)
    lsh = by["duplication", "lsh"]
    assert (lsh["recorded"], lsh["unknown"], lsh["estimate_s"]) == (0, 5, None)
    assert by["listops", "dense"]["planned"] == 3 + 2 - 1  # two seeds on ListOps
    text = format_quality_plan(rows)
    assert "| duplication | dense | 5 | 4 | 1 | 0.003 | 0.02 |" in text
    assert "| duplication | local | 5 | 1 | 4 | after the sweep |" in text
    assert "5 of 27 cells recorded" in text
    # a finished sweep whose cells all diverged: the planner's middle rate, as run_quality
    bad = [_fake("duplication", "sparse-fixed", 256, r, 0, None, status="diverged")
           for r in (1e-3, 3e-3, 1e-2)]  # fmt: skip
    with open(out / "results.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in bad))
    (row,) = quality_plan(["duplication"], ["sparse-fixed"], budget=budget, out=out)
    assert (row["best_lr"], row["recorded"], row["to_run"], row["waiting"]) == (3e-3, 3, 2, 0)
    # --steps: the estimate counts those steps
    (row,) = quality_plan(["duplication"], ["dense"], budget=budget, out=out, steps=40)
    assert row["estimate_s"] == pytest.approx(40 * (4 * 0.1 + 0.3) / 5)
    # a fixed rate: no sweep, seeds x lengths
    rows = quality_plan(["duplication"], ["dense"], budget=budget, out=out, lr=1e-3)
    assert (rows[0]["planned"], rows[0]["recorded"]) == (3, 2)
    # the CLI prints the plan and writes nothing
    fresh = tmp_path / "fresh"
    assert main(["bench", "--part", "quality", "--tasks", "duplication", "--attention", "dense",
                 "--out", str(fresh), "--plan"]) == 0  # fmt: skip
    assert "0 of 5 cells recorded" in capsys.readouterr().out and not fresh.exists()
    assert main(["bench", "--plan"]) == 2
    assert "--plan only apply to --part quality" in capsys.readouterr().err


def test_tasks_and_mechanisms_are_listed(capsys):
    assert main(["bench", "--list-mechanisms"]) == 0
    text = capsys.readouterr().out
    for name in (*TASKS, *MECHANISMS, *BUDGETS):
        assert name in text


def test_lm_smoke_on_real_text_with_recurrent_families(tmp_path, shared_data):
    shared_data("ptb")
    recs = run_quality(["lm-ptb"], ["dense", "xl", "compressive"], budget="smoke",
                       out=tmp_path / "lm", data=shared_data.root, progress=False)  # fmt: skip
    assert [r["status"] for r in recs] == ["ok"] * 3, [r.get("error") for r in recs]
    for r in recs:
        assert r["metric"] == "bpc" and 1.0 < r["test"] < 9.0 and r["curve"]
    assert (tmp_path / "lm" / "lm.png").is_file()
    assert "### lm-ptb" in (tmp_path / "lm" / "table.md").read_text()


def test_an_lsh_lm_cell_is_also_scored_with_other_hash_counts_and_full_attention(
    tmp_path, shared_data
):
    """On the LM the LSH-trained weights are scored with 1, 2, 4, 8 hashes and with every key
    visible (bpc on the test split); 2 hashes is how the cell itself was scored (other random
    rotations: close, not equal), the others differ, and the table prints them."""
    shared_data("ptb")
    (rec,) = run_quality(["lm-ptb"], ["lsh"], budget="smoke", out=tmp_path / "lm",
                         data=shared_data.root, progress=False)  # fmt: skip
    assert rec["status"] == "ok", rec.get("error")
    h = rec["hash_evals"]
    assert set(h) == {"hashes_1", "hashes_2", "hashes_4", "hashes_8", "full"}
    assert h["hashes_2"] == pytest.approx(rec["test"], rel=0.02) and h["hashes_2"] != rec["test"]
    assert all(1.0 < v < 9.0 for v in h.values())
    assert len({round(v, 6) for v in h.values()}) == 5
    table = (tmp_path / "lm" / "table.md").read_text()
    assert "full attention (test bpc" in table and f"{h['full']:.3f}" in table


def test_mqar_breakdown_splits_queries_by_what_the_last_layer_can_attend():
    import torch

    from effiformer import create_model
    from effiformer.bench.quality import _last_layer_keep, mqar_breakdown
    from effiformer.tasks.mqar import MQARTask

    task = MQARTask(seq_len=128, eval_sequences=16)
    torch.manual_seed(0)
    local = create_model("vanilla-tiny", seq_len=128, vocab_size=256,
                         attention={"name": "local", "window": 16})  # fmt: skip
    keep = _last_layer_keep(local, 128)
    # own block and the previous one, causally
    assert keep[40, 32] and keep[40, 16] and not keep[40, 15] and not keep[40, 41]
    d = mqar_breakdown(local, task, sequences=16)
    assert d["queries"] == 16 * task.n_pairs
    assert 0.0 < d["direct_fraction"] < 1.0  # some pairs beyond the window at T = 128
    assert sum(v["queries"] for v in d["by_distance"].values()) == d["queries"]
    dense = create_model("vanilla-tiny", seq_len=128, vocab_size=256)
    assert mqar_breakdown(dense, task, sequences=4)["direct_fraction"] == 1.0
    sparse = create_model("vanilla-tiny", seq_len=128, vocab_size=256,
                          attention={"name": "sparse", "pattern": "strided", "stride": 8})  # fmt: skip
    k = _last_layer_keep(sparse, 128)
    assert k[100, 92] and k[100, 95] and not k[100, 91] and not k[100, 101]  # 92: (100-92)%8==0
    lsh = create_model("vanilla-tiny", seq_len=128, vocab_size=256, attention="lsh")
    assert "direct_fraction" not in mqar_breakdown(lsh, task, sequences=2)  # content-based


def test_the_sweep_prefers_the_rate_that_reached_the_target_in_the_fewest_steps():
    """Cells that stopped at the target count as equal; the fewest steps wins among them (a
    rate that reached 99.7% at step 6,000 is not better than one at 99.5% by step 2,500)."""
    from effiformer.bench.quality import _best_lr

    recs = [
        {"status": "ok", "lr": 1e-3, "valid": 0.997, "steps_done": 6000},
        {"status": "ok", "lr": 3e-3, "valid": 0.995, "steps_done": 2500},
        {"status": "ok", "lr": 1e-2, "valid": 0.40, "steps_done": 8000},
        {"status": "diverged", "lr": 3e-2, "valid": None},
    ]
    assert _best_lr(recs, True, 0.995) == 3e-3
    assert _best_lr(recs, True) == 1e-3  # without a target the best metric wins
    assert _best_lr(recs[2:], True, 0.995) == 1e-2
    assert _best_lr(recs[3:], True, 0.995) is None
    lm = [{"status": "ok", "lr": 1e-3, "valid": 1.9}, {"status": "ok", "lr": 3e-3, "valid": 1.7}]
    assert _best_lr(lm, False) == 3e-3  # bits per character: lower is better


def test_a_row_run_at_several_rates_shows_its_best_rate_not_their_mean():
    """Cells of one row trained at several rates with ``--lr X`` (a check of the chosen rate)
    are not seeds: the row shows the rate with the best validation score, and a note under the
    table names the others with their scores."""
    base = {"task": "lm-ptb", "mechanism": "dense", "length": 1024, "phase": "main",
            "status": "ok", "settings": {"name": "dense"}, "target": None}  # fmt: skip
    recs = [
        {**base, "lr": 3e-3, "seed": 0, "valid": 2.229, "test": 2.184},
        {**base, "lr": 1e-3, "seed": 0, "valid": 2.495, "test": 2.459},
        {**base, "lr": 1e-2, "seed": 0, "valid": 2.316, "test": 2.276},
        {**base, "lr": 3e-3, "seed": 1, "valid": 2.231, "test": 2.190},
    ]
    table = format_quality_table(recs)
    row = next(line for line in table.splitlines() if line.startswith("| dense |"))
    assert row.startswith("| dense | 0.003 | 2.187 ± 0.003 (2) |"), row
    assert "dense at T=1024, lr 0.001: 2.459 (1); dense at T=1024, lr 0.01: 2.276 (1)" in table


def test_a_budget_can_give_longer_sequences_more_steps():
    """The CPU budget's MQAR cells at 1,024 tokens get 24,000 steps (dense forms its recall
    circuit on the ladder's short sequences near step 8,000 there and reaches 99% at 1,024 near
    step 20,000); the other lengths keep 8,000; --steps still overrides every cell."""
    from effiformer.bench.quality import BUDGETS, _make_cell

    b = BUDGETS["cpu"]
    assert [b.tasks["mqar"].steps_at(t) for t in (64, 256, 1024)] == [8000, 8000, 24000]
    assert _make_cell(b, "mqar", "dense", 1024, 1e-3, 0, None, data=None)["steps"] == 24000
    assert _make_cell(b, "mqar", "dense", 256, 1e-3, 0, None, data=None)["steps"] == 8000
    assert _make_cell(b, "mqar", "dense", 1024, 1e-3, 0, 50, data=None)["steps"] == 50


# ------------------------------------------------------------------ equal compute (issue 25)


def test_equal_compute_allocates_the_steps_that_fit_the_same_quiet_seconds():
    from effiformer.bench.quality import allocate_steps, loaded

    table = {"lm/dense/T4096": 0.2, "lm/local/T4096": 0.05, "lm/xl/T4096": 0.7}
    assert allocate_steps(table, 900) == {
        "lm/dense/T4096": 4500, "lm/local/T4096": 18000, "lm/xl/T4096": 1285
    }  # fmt: skip
    assert allocate_steps({"a": 10.0}, 5) == {"a": 1}  # never zero steps
    with pytest.raises(ValueError, match="positive number of seconds"):
        allocate_steps(table, 0)
    with pytest.raises(ValueError, match="lm/x: a step time must be a positive number"):
        allocate_steps({"lm/x": float("nan")}, 10)
    quiet = {"loadavg": [1.1, 1.0, 1.0], "cpu_count": 2, "threads": 1}
    busy = {"loadavg": [3.4, 3.0, 2.5], "cpu_count": 2, "threads": 1}
    assert not loaded(quiet) and loaded(busy)


def test_an_equal_time_run_times_each_pair_once_and_trains_its_allocation(tmp_path, caplog):
    from effiformer.bench.quality import allocate_steps, run_quality

    out = tmp_path / "eq"
    kw = dict(budget="smoke", out=out, plot=False, progress=False, equal_time=0.4)
    recs = run_quality(["mqar"], ["dense", "local"], **kw)
    timing = json.loads((out / "timing.json").read_text())
    assert sorted(timing) == ["mqar/dense/T64", "mqar/local/T64"]
    want = allocate_steps({k: v["step_s"] for k, v in timing.items()}, 0.4)
    for r in recs:
        assert r["status"] == "ok"
        key = f"mqar/{r['mechanism']}/T64"
        assert r["steps"] == r["steps_done"] == want[key]
        assert r["equal_time"] == {"seconds": 0.4, "step_s_quiet": timing[key]["step_s"]}
    assert json.loads((out / "quality.json").read_text())["equal_time"] == 0.4
    # resuming times nothing again and trains nothing again
    before = (out / "timing.json").read_text(), (out / "results.jsonl").read_text()
    run_quality(["mqar"], ["dense", "local"], **kw)
    assert ((out / "timing.json").read_text(), (out / "results.jsonl").read_text()) == before
    with pytest.raises(ValueError, match="another plan \\(equal_time differ\\)"):
        run_quality(["mqar"], ["dense"], **{**kw, "equal_time": 0.8})
    with pytest.raises(ValueError, match="give steps or equal_time, not both"):
        run_quality(["mqar"], ["dense"], **{**kw, "out": tmp_path / "other"}, steps=3)


def test_a_model_ablation_changes_only_what_it_names():
    from effiformer.bench.quality import _model_overrides

    model, dense = _model_overrides(BUDGETS["cpu"], "lm-ptb", "dense", 1024)
    _, ablated = _model_overrides(BUDGETS["cpu"], "lm-ptb", "dense-sinusoidal", 1024)
    assert model == "vanilla-tiny" and ablated == {**dense, "positions": "sinusoidal"}
    assert not MECHANISMS["dense-sinusoidal"].default  # run only when named
    # relative-XL's row is Transformer-XL's input: the relative terms are its only positions;
    # the ablation adds the vanilla model's learned absolute positions under them
    _, rel = _model_overrides(BUDGETS["cpu"], "mqar", "relative-xl", 1024)
    _, absolute = _model_overrides(BUDGETS["cpu"], "mqar", "relative-xl-abspos", 1024)
    assert rel["positions"] == "none" and "positions" not in absolute  # the model's default
    assert {k: v for k, v in rel.items() if k != "positions"} == absolute
    assert not MECHANISMS["relative-xl-abspos"].default and MECHANISMS["relative-xl"].default
    # adaptive span's row is the official model too (key_pe its only positions)
    _, span = _model_overrides(BUDGETS["cpu"], "mqar", "adaptive-span", 64)
    _, span_abs = _model_overrides(BUDGETS["cpu"], "mqar", "adaptive-span-abspos", 64)
    assert span["positions"] == "none" and "positions" not in span_abs
    assert {k: v for k, v in span.items() if k != "positions"} == span_abs
    assert not MECHANISMS["adaptive-span-abspos"].default and MECHANISMS["adaptive-span"].default
    # and its other ablations change one setting of the abspos model
    _, pe0 = _model_overrides(BUDGETS["cpu"], "mqar", "adaptive-span-pe0", 64)
    assert pe0 == {**span_abs, "attention": {**span_abs["attention"], "key_pe_std": 0.0}}
    # routing-rel: the released models' positions (relative tables over every local distance,
    # no absolute embeddings); the row keeps the default model
    _, rt = _model_overrides(BUDGETS["cpu"], "mqar", "routing", 256)
    _, rt_rel = _model_overrides(BUDGETS["cpu"], "mqar", "routing-rel", 256)
    assert "positions" not in rt and rt_rel["positions"] == "none"
    assert rt_rel["attention"] == {**rt["attention"], "max_relative_position": 64}
    _, rt_nopos = _model_overrides(BUDGETS["cpu"], "mqar", "routing-nopos", 256)
    assert rt_nopos == {**rt, "positions": "none"}


def test_the_recurrent_segment_is_a_budget_setting_and_the_rest_of_t_is_memory():
    from effiformer.bench.quality import TaskBudget, _model_overrides

    for budget, t, seg in (("cpu", 1024, 512), ("cpu-long", 4096, 512)):
        _, xl = _model_overrides(BUDGETS[budget], "lm-ptb", "xl", t)
        _, comp = _model_overrides(BUDGETS[budget], "lm-ptb", "compressive", t)
        assert (xl["seq_len"], xl["mem_len"]) == (seg, t - seg)
        assert (comp["seq_len"], comp["mem_len"], comp["cmem_len"]) == (
            seg, (t - seg) // 2, (t - seg) // 2)  # fmt: skip
    long = BUDGETS["cpu-long"]
    assert (long.dim, long.n_layers, long.n_heads) == (256, 4, 4)  # the *-small size
    bad = dataclasses.replace(long, tasks={"lm-ptb": TaskBudget((4096,), 10, 4096, 1, (1e-3,),
                                                                5, segment=4096)})  # fmt: skip
    with pytest.raises(ValueError, match="recurrent segment must lie in \\(0, 4096\\), got 4096"):
        _model_overrides(bad, "lm-ptb", "xl", 4096)


def test_the_curve_may_score_a_prefix_while_the_end_scores_the_whole_split(
    tmp_path, shared_data, monkeypatch
):
    from effiformer.bench import quality

    shared_data("ptb")
    smoke = quality.BUDGETS["smoke"]
    lm = dataclasses.replace(smoke.tasks["lm-ptb"],
                             options={"eval_tokens": 4096, "curve_eval_tokens": 512})  # fmt: skip
    monkeypatch.setitem(quality.BUDGETS, "smoke", dataclasses.replace(
        smoke, tasks={**smoke.tasks, "lm-ptb": lm}))  # fmt: skip
    out = tmp_path / "lm"
    (rec,) = run_quality(["lm-ptb"], ["dense"], budget="smoke", out=out, data=shared_data.root,
                         progress=False, plot=False)  # fmt: skip
    assert rec["status"] == "ok"
    cell_dir = out / "cells" / rec["cell"].replace("/", "_")
    evals = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()
             if "val_tokens" in line]  # fmt: skip
    # targets scored: the prefix (512 characters, less the streams' first tokens) along the way,
    # 4,096 at the end
    assert evals and all(448 <= e["val_tokens"] <= 512 for e in evals)
    for split in ("valid_all", "test_all"):
        assert 3584 <= rec[split]["tokens"] <= 4096


def test_a_cell_stopped_part_way_continues_from_its_checkpoint_to_the_same_result(tmp_path):
    """A long cell killed part way resumes from its last checkpoint (``run_dir/latest``): the
    weights, optimizer, data position and RNG, so the resumed cell ends where an uninterrupted
    one does, to the bit."""
    from effiformer.bench.quality import _make_cell, run_quality_cell

    def cell(run_dir, steps):
        c = _make_cell(BUDGETS["smoke"], "mqar", "dense", 64, 3e-3, 0, steps, data=None,
                       out=tmp_path)  # fmt: skip
        return {**c, "run_dir": str(tmp_path / run_dir), "eval_every": 2}

    whole = run_quality_cell(cell("whole", 8))
    first = run_quality_cell(cell("parts", 4))  # the part that ran before the kill
    assert first["steps_done"] == 4 and (tmp_path / "parts" / "latest").exists()
    rest = run_quality_cell(cell("parts", 8))
    assert rest["steps_done"] == whole["steps_done"] == 8
    assert (rest["valid"], rest["test"]) == (whole["valid"], whole["test"])
    assert rest["valid_all"]["loss"] == whole["valid_all"]["loss"]


def test_sweep_cells_at_other_rates_compete_with_fixed_rate_cells():
    """A sweep run after cells trained at a fixed rate (``--lr 1e-3``, phase main): its cells at
    the other rates are not dropped from the table; the row shows the rate the sweep's rule
    picks among the seed-0 cells (with the budget's target: the fewest steps to it wins), and
    the other rates are listed under the table."""
    base = {"task": "mqar", "mechanism": "routing", "length": 64, "status": "ok",
            "settings": {"name": "routing"}, "budget": "cpu"}  # fmt: skip
    recs = [
        {**base, "phase": "main", "lr": 1e-3, "seed": 0, "valid": 0.998, "test": 0.996,
         "steps_done": 6000},
        {**base, "phase": "sweep", "lr": 3e-3, "seed": 0, "valid": 0.997, "test": 0.998,
         "steps_done": 5000},
        {**base, "phase": "sweep", "lr": 1e-2, "seed": 0, "valid": 0.26, "test": 0.254,
         "steps_done": 8000},
        {**base, "phase": "main", "lr": 1e-3, "seed": 0, "valid": 0.23, "test": 0.222,
         "steps_done": 8000, "length": 256},
    ]  # fmt: skip
    table = format_quality_table(recs)
    row = next(line for line in table.splitlines() if line.startswith("| routing |"))
    # both reached the cpu budget's target (99.5%): 3e-3 got there in fewer steps
    assert row.startswith("| routing | 0.001, 0.003 | 99.8% (1) | 22.2% (1) |"), row
    assert "routing at T=64, lr 0.001: 99.6% (1); routing at T=64, lr 0.01: 25.4% (1)" in table
    # without a target (the smoke budget has none), the best validation score alone decides
    smoke = [{**r, "budget": "smoke"} for r in recs]
    row = next(x for x in format_quality_table(smoke).splitlines() if x.startswith("| routing |"))
    assert row.startswith("| routing | 0.001 | 99.6% (1) | 22.2% (1) |"), row


def test_hash_counts_table_reads_the_rows_chosen_cells_not_every_rate():
    base = {"task": "duplication", "mechanism": "lsh", "length": 256, "status": "ok",
            "settings": {"name": "lsh"}, "budget": "cpu", "phase": "sweep"}  # fmt: skip

    def h(x):
        return {"hashes_1": x, "hashes_2": x, "hashes_4": x, "hashes_8": x, "full": 1.0}

    recs = [
        {**base, "lr": 1e-3, "seed": 0, "valid": 0.99, "test": 0.99, "hash_evals": h(0.9)},
        {**base, "lr": 1e-2, "seed": 0, "valid": 0.5, "test": 0.5, "hash_evals": h(0.1)},
        {**base, "lr": 1e-3, "seed": 1, "valid": 0.99, "test": 0.99, "hash_evals": h(0.8),
         "phase": "main"},
    ]  # fmt: skip
    table = format_quality_table(recs)
    # 1e-3 is the row's rate: its two seeds (0.9, 0.8), not the 1e-2 cell's 0.1
    assert "| 256 (2) | 85.0% | 85.0% | 85.0% | 85.0% | 100.0% |" in table, table


def test_the_table_shows_cells_another_run_appended_to_the_folder_meanwhile(tmp_path):
    """Two runs on one folder with disjoint rows (two processes, as the CPU plan runs its
    lanes): each run's table is written from the records file, so the last one to finish does
    not drop the other's cells."""
    out = tmp_path / "q"

    def other_process_appends(rec):  # a cell of another row lands while this run goes on
        other = {**rec, "cell": rec["cell"].replace("/dense/", "/local/"), "mechanism": "local",
                 "test": 0.4321, "valid": 0.4321}  # fmt: skip
        # and one of a row this process's registry does not know (the other process runs a
        # newer version, with an ablation added since this one started): shown, not dropped
        newer = {**other, "cell": other["cell"].replace("/local/", "/newer-ablation/"),
                 "mechanism": "newer-ablation", "test": 0.1234}  # fmt: skip
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(other) + "\n" + json.dumps(newer) + "\n")

    run_quality(["mqar"], ["dense"], budget="smoke", out=out, progress=False,
                on_record=other_process_appends)  # fmt: skip
    table = (out / "table.md").read_text()
    assert "| local |" in table and "43.2%" in table and "| dense |" in table
    assert "| newer-ablation |" in table and "12.3%" in table


def test_recorded_cells_checks_every_cell_before_returning(tmp_path):
    from effiformer.bench.quality import recorded_cells

    with pytest.raises(ValueError, match="results.jsonl does not exist"):
        recorded_cells(tmp_path, ["a"])
    recs = [{"cell": "mqar/dense/T64/lr0.001/s0"}, {"cell": "mqar/local/T64/lr0.001/s0"}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = tmp_path / "cells" / "mqar_dense_T64_lr0.001_s0"
    run.mkdir(parents=True)
    (run / "latest").write_text("step-00000010\n")
    with pytest.raises(ValueError, match="no record of mqar/lsh"):
        recorded_cells(tmp_path, ["mqar/dense/T64/lr0.001/s0", "mqar/lsh/T64/lr0.001/s0"])
    with pytest.raises(ValueError, match="no checkpoint of mqar/local"):
        recorded_cells(tmp_path, ["mqar/dense/T64/lr0.001/s0", "mqar/local/T64/lr0.001/s0"])
    ((rec, where),) = recorded_cells(tmp_path, ["mqar/dense/T64/lr0.001/s0"])
    assert rec == recs[0] and where == run


def test_module_inputs_returns_each_call_in_order_and_removes_its_hooks():
    import torch

    from effiformer.bench.quality import module_inputs

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.a(self.b(x) * 2.0)

    m = Two().train()
    x = torch.randn(2, 3)
    seen = module_inputs(m, x, [m.a, m.b])
    assert [mod for mod, _, _ in seen] == [m.b, m.a]  # the order the model calls them
    torch.testing.assert_close(seen[0][1], x)
    with torch.no_grad():
        torch.testing.assert_close(seen[1][1], m.b(x) * 2.0)
    assert not m.training  # scored in eval mode
    assert not m.a._forward_pre_hooks and not m.b._forward_pre_hooks
