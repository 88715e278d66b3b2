"""The scripts under benchmarks/ that produce the README's figures still run and record what
the README reads from them (tiny sizes, fixed steps: nothing here is timed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from effiformer import load_model
from effiformer.data import load_corpus
from effiformer.tasks import LMTask

ROOT = Path(__file__).resolve().parents[1]


def test_xl_vs_vanilla_records_longer_memory_evaluations_and_saves_models(
    tmp_path, data_env, bench_script
):
    data_env("tinyshakespeare/input.txt")  # the script's corpus
    xl_vs_vanilla = bench_script("xl_vs_vanilla")
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


def test_funnel_flops_counts_the_dense_encoder_exactly(bench_script):
    """The FLOP counter sees every matmul of the dense row, SDPA's CPU kernels included (they
    have no formula in PyTorch): 18 layers x (3 x projections and FFN + 3.5 x attention), plus the
    tied LM head's forward (its logits are computed but not in the loss)."""
    funnel_flops = bench_script("funnel_flops")
    torch.manual_seed(0)
    r = funnel_flops.encoder_pair(64, 32, 1)
    b, t, d, f, n_layers, vocab = 1, 32, 64, 256, 18, 1000
    linear = 2 * b * t * (4 * d * d + 2 * d * f)
    attention = 4 * b * t * t * d
    dense = n_layers * (3 * linear + 3.5 * attention) + 2 * b * t * d * vocab
    assert r["dense_gflop"] * 1e9 == dense
    assert 0.5 < r["ratio"] < 0.7  # pooling halves the length twice; relative attention costs more


def test_sparse_flops_counts_the_pattern_and_the_plan(tmp_path, bench_script):
    sparse_flops = bench_script("sparse_flops")
    out = tmp_path / "flops.jsonl"
    assert sparse_flops.main(["--lengths", "1024", "--out", str(out)]) == 0
    rows = {r["config"]: r for r in map(json.loads, out.read_text().splitlines())}
    fixed = rows["fixed-128-c32"]
    # the plan computes at least the pattern; summary keys make fixed far denser than strided
    assert fixed["computed_gflop_fwd_bwd"] >= fixed["pattern_gflop_fwd_bwd"]
    assert rows["strided-128"]["keys_per_query"] < fixed["keys_per_query"]
    assert fixed["flop_limit_layer"] < fixed["flop_limit_attention"]


def test_sparse_speed_times_every_workload_interleaved(tmp_path, bench_script):
    sparse_speed = bench_script("sparse_speed")
    out = tmp_path / "speed.jsonl"
    threads = torch.get_num_threads()
    try:
        assert sparse_speed.main(["--lengths", "256", "--rounds", "1", "--threads", "1",
                                  "--out", str(out)]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    names = {r["name"] for r in map(json.loads, out.read_text().splitlines())}
    assert {"sdpa", "vanilla-small", "sparse-bench-fixed-128"} <= names


def test_lm_mechanisms_rows_build_the_named_attention_in_the_same_decoder(bench_script):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        rows = bench_script("lm_mechanisms_tinyshakespeare").ROWS
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


# ------------------------------------------------------------------------------------------------
# Missing data (issue 28, item 6): one line naming the data set, exit status 2, no traceback
# ------------------------------------------------------------------------------------------------

#: Every script that reads a data set: the arguments it needs besides --data, and what its error
#: line names.
DATA_SCRIPTS = {
    "train_tinyshakespeare": ([], "tinyshakespeare/input.txt"),
    "lm_mechanisms_tinyshakespeare": (["--out", "OUT"], "tinyshakespeare/input.txt"),
    "adaptive_span_vs_dense": (["--out", "OUT"], "tinyshakespeare/input.txt"),
    "adaptive_span_gradients": (["--out", "OUT"], "tinyshakespeare/input.txt"),
    "reformer_lm_vs_dense": (["--out", "OUT"], "tinyshakespeare/input.txt"),
    "routing_vs_vanilla": (["--out", "OUT"], "tinyshakespeare/input.txt"),
    "xl_vs_vanilla": (["--corpora", "ptb", "--out", "OUT"], "ptb/ptb.train.txt"),
    "funnel_glue": (["--out", "OUT"], "glue/SST-2/train.tsv"),
    "hat_beyond": (["--limits", "1", "--fitness", "train", "--out", "OUT"], "tinyshakespeare"),
    "hat_predictor_released": (["--out", "OUT"], "hat-latency"),
    "hat_supernet_multi30k": (["--out", "OUT"], "multi30k"),
    "hat_search_multi30k": (
        ["--super", "S", "--predictor", "P", "--limits", "1", "--out", "OUT"],
        "multi30k",
    ),
    "lite_vs_dense_multi30k": (["--out", "OUT"], "multi30k"),
    "quality_extend": (
        ["--from", "F", "--cell", "lm-ptb/dense/T1024/lr0.003/s0", "--steps", "9", "--out", "OUT"],
        "ptb",
    ),
    "gpu_suite": (["--out", "OUT"], "ptb"),
    "quality_step_times": (["time", "--out", "OUT"], "ptb"),
    "translation_multi30k": (["--out", "OUT"], "multi30k"),
}


def _argv(name: str, tmp_path: Path) -> list[str]:
    return [str(tmp_path / a) if a in ("OUT", "S", "P") else a for a in DATA_SCRIPTS[name][0]]


def test_every_data_script_is_listed():
    """A new script that reads EFFIFORMER_DATA joins DATA_SCRIPTS (and checks its data first)."""
    readers = {
        p.stem
        for p in (ROOT / "benchmarks").glob("*.py")
        if "_data.data_root" in p.read_text() or "EFFIFORMER_DATA" in p.read_text()
    }
    readers.discard("_data")  # the helper itself
    assert readers <= set(DATA_SCRIPTS), readers - set(DATA_SCRIPTS)


@pytest.mark.parametrize("name", sorted(DATA_SCRIPTS))
def test_a_script_without_its_data_stops_first_with_one_line(name, tmp_path, capsys, bench_script):
    empty = tmp_path / "empty"
    empty.mkdir()
    module = bench_script(name)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as stop:
            module.main([*_argv(name, tmp_path), "--data", str(empty)])
    finally:
        torch.set_num_threads(threads)
        sys.path[:] = [p for p in sys.path if p != str(ROOT / "benchmarks")]
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{name}.py: needs ") and DATA_SCRIPTS[name][1] in err
    assert f"under the data folder {empty} (set --data DIR or EFFIFORMER_DATA)" in err
    assert sorted(os.listdir(tmp_path)) == ["empty"]  # nothing written before the check


def test_the_readme_commands_without_data_print_one_line_not_a_traceback(tmp_path):
    """`python benchmarks/SCRIPT.py` as the README runs it, in a clone without the data: exit 2
    and one line naming the data set, with --data DIR or EFFIFORMER_DATA pointing at an empty
    folder."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    runs = [
        ("train_tinyshakespeare", ["--data", str(empty)], {}),
        ("translation_multi30k", ["--data", str(empty)], {}),
        ("funnel_glue", ["--data", str(empty)], {}),
        ("xl_vs_vanilla", [], {"EFFIFORMER_DATA": str(empty)}),
    ]
    for name, flags, extra in runs:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *_argv(name, tmp_path),
             *flags],
            capture_output=True, text=True, cwd=tmp_path, env={**env, **extra}, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{name}.py: needs "), proc.stderr
        assert DATA_SCRIPTS[name][1] in lines[0] and str(empty) in lines[0]
        assert proc.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_the_gpu_suite_runs_its_stages_at_tiny_size_on_the_cpu(tmp_path, bench_script):
    """benchmarks/gpu_suite.py, prepared for a lent GPU, runs here at toy sizes: every stage
    recorded with its status and time, the layer cells measured, the quality cells finished."""
    gpu_suite = bench_script("gpu_suite")
    out = tmp_path / "gs"
    threads = torch.get_num_threads()
    try:
        code = gpu_suite.main(["--tiny", "--device", "cpu", "--skip-tests", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    report = json.loads((out / "suite.json").read_text())
    assert code == 0, report
    assert list(report["stages"]) == ["layers", "quality"]
    layers, quality = report["stages"]["layers"], report["stages"]["quality"]
    assert layers["status"] == "ok" and layers["summary"].startswith("6 of 6 layer cells")
    assert quality["status"] == "ok" and quality["summary"].startswith("2 of 2 quality cells")
    assert (out / "layers" / "results.jsonl").is_file() and (out / "README.md").is_file()
    if not torch.cuda.is_available():  # refused in one line, nothing run
        assert gpu_suite.main(["--out", str(tmp_path / "x"), "--device", "cuda"]) == 2
        assert not (tmp_path / "x").exists()


def test_time_budget_runs_size_their_schedule_through_train(tmp_path, data_env, bench_script):
    """--time-budget: the script leaves the schedule to train() (steps=None), which times its
    first steps and records the length it chose (schedule_steps)."""
    data_env("tinyshakespeare/input.txt")
    xl_vs_vanilla = bench_script("xl_vs_vanilla")
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        assert xl_vs_vanilla.main([
            "--corpora", "tinyshakespeare", "--models", "vanilla-small", "--time-budget", "3",
            "--seq-len", "16", "--batch", "2", "--eval-mem", "16", "--eval-tokens", "200",
            "--eval-batch", "2", "--set", "dim=32", "n_heads=2", "n_layers=1", "ffn_dim=64",
            "--out", str(out),
        ]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    (rec,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()[1:]]
    assert rec["stop_reason"] in ("time_budget", "steps")
    assert rec["schedule_steps"] >= rec["steps"] > 0


def test_compile_time_script_reports_first_call_and_steps(bench_script, capsys, keep_threads):
    script = bench_script("compile_time")
    assert script.main(["vanilla-tiny", "--backend", "aot_eager", "--steps", "1"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["model"] == "vanilla-tiny" and rec["backend"] == "aot_eager"
    assert rec["first_call_s"] > 0 and rec["compiled_step_s"] > 0 and rec["eager_step_s"] > 0


def test_ops_before_after_report_reads_all_three_benchmarks(tmp_path, bench_script, capsys):
    """The report of ``ops_before_after.sh``: each benchmark's records (the formats of the
    committed quiet runs) on both sides give one row per (workload, T) with after / before."""
    import shutil

    res = ROOT / "benchmarks" / "results"
    for side, scale in (("before", 1.0), ("after", 2.0)):
        rows = [
            json.loads(x)
            for x in (res / "sparse_speed_2threads_quiet.jsonl").read_text().splitlines()
        ]
        for r in rows:
            r["wall_ms_median"] *= scale
        (tmp_path / f"sparse_speed_{side}_r1.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
        shutil.copy(res / "routing_bench_quiet.jsonl", tmp_path / f"routing_bench_{side}_r1.jsonl")
        (tmp_path / f"reformer_bench_{side}_r1").mkdir()
        shutil.copy(res / "reformer_bench_quiet" / "summary.jsonl",
                    tmp_path / f"reformer_bench_{side}_r1" / "summary.jsonl")  # fmt: skip
    assert bench_script("ops_before_after_report").main(["--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text()
    assert "| sparse_speed sparse-bench-strided-128 | 16,384 |" in table
    assert (
        "| routing_bench effiformer | 16,384 |" in table
        and "| reformer_bench lsh | 16,384 |" in table
    )
    strided = next(x for x in table.splitlines() if "strided-128 | 16,384" in x)
    assert strided.endswith("| 2.000 |")  # the after side was doubled
    assert "| routing_bench sdpa | 16,384 | 2573.0 | 2573.0 | 1.000 |" in table


def test_adaptive_span_gradients_splits_the_norm_and_clips_each_part(
    tmp_path, bench_script, shared_data
):
    """The two runs start from the same weights on the same batches (same first loss); the
    logged norm is split exactly into the span parameters' and the rest's; the span
    parameters stay in [0, 1] (spans between 0 and T)."""
    shared_data("tinyshakespeare/input.txt")
    out = tmp_path / "asg"
    argv = ["--seq-len", "64", "--steps", "3", "--warmup", "1", "--data", str(shared_data.root),
            "--out", str(out)]  # fmt: skip
    assert bench_script("adaptive_span_gradients").main(argv) == 0
    runs = {}
    for clip in ("global", "split"):
        rows = [json.loads(x) for x in (out / f"{clip}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 3]
        for r in rows:
            split = (r["span_grad_norm"] ** 2 + r["rest_grad_norm"] ** 2) ** 0.5
            assert abs(split - r["grad_norm"]) <= 1e-6 * r["grad_norm"]
            assert len(r["spans"]) == 4 and all(0 <= s <= 64 for s in r["spans"])
        runs[clip] = rows
    assert runs["global"][0]["loss"] == runs["split"][0]["loss"]
    assert (out / "gradients.png").is_file()
