"""The benchmark harness: records, errors, skips, memory accounting and FLOP counts.

Nothing here asserts a time. Cells run in fresh processes (a few seconds each for the imports),
so the tests share runs and keep to ~7 cell processes in all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from effiformer import create_model, list_models
from effiformer.bench import (
    estimate_cell_bytes,
    format_table,
    references,
    register_reference,
    resolve_names,
    run_bench,
)
from effiformer.bench.cell import bench_overrides, count_flops, model_workload
from effiformer.bench.references import CellSpec
from effiformer.cli import main
from effiformer.registry import get_config

REQUIRED = (
    "name", "part", "seq_len", "batch", "fwd_ms", "fwd_bwd_ms", "peak_mib", "flops_fwd",
    "flops_fwd_bwd", "mfu", "params", "status", "reason", "env",
)  # fmt: skip
ENV_KEYS = ("torch", "device_name", "threads", "git_sha", "python", "peak_tflops")
FAST = dict(repeats=1, warmup=0, progress=False)


@pytest.fixture
def isolated_refs(monkeypatch):
    """Registrations made in a test disappear after it."""
    monkeypatch.setattr(references, "_REFERENCES", dict(references._REFERENCES))


def dense_attention_flops(
    b: int, t: int, d: int, h: int, dh: int, causal: bool = True
) -> tuple[int, int]:
    """What FlopCounterMode counts for DenseAttention on x (B, T, D), with P (query, key) pairs:
    T*T, or T*(T+1)/2 for a causal call (the pairs a causal SDPA kernel computes).

    forward: Q, K, V projections 3 * 2*B*T*D*(H*Dh), output projection 2*B*T*(H*Dh)*D,
             Q K^T and A V 2 * 2*B*H*P*Dh.
    backward: every projection twice more (grad of its input and of its weight), SDPA backward
              5 matmuls (scores recomputed, dA, dV, dQ, dK) 5 * 2*B*H*P*Dh.
    """
    pairs = t * (t + 1) // 2 if causal else t * t
    inner = h * dh
    proj = 8 * b * t * d * inner
    attn = 4 * b * h * pairs * dh
    return proj + attn, 3 * proj + attn + 10 * b * h * pairs * dh


# ------------------------------------------------------------------------------------ one real run


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One CLI run shared by the tests below: a glob, --set, both parts, the sdpa reference;
    length 64 runs (3 cell processes), 10**6 cannot fit anywhere and is skipped before it starts."""
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "vanilla-t*", "--part", "both", "--lengths", "64", str(10**6)]
    argv += ["--set", "n_layers=1", "--refs", "sdpa", "--repeats", "1", "--warmup", "0"]
    argv += ["--no-progress", "--out", str(out)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    lines = (out / "results.jsonl").read_text().splitlines()
    return code, [json.loads(line) for line in lines], printed.getvalue(), out


def test_jsonl_has_required_fields_for_every_cell(cli_run):
    code, records, _, _ = cli_run
    assert code == 0
    # {model: vanilla-tiny, attention: vanilla-tiny + sdpa} x {64, 10**6}
    assert [(r["part"], r["name"], r["seq_len"], r["status"]) for r in records] == [
        ("model", "vanilla-tiny", 64, "ok"),
        ("model", "vanilla-tiny", 10**6, "skipped"),
        ("attention", "vanilla-tiny", 64, "ok"),
        ("attention", "sdpa", 64, "ok"),
        ("attention", "vanilla-tiny", 10**6, "skipped"),
        ("attention", "sdpa", 10**6, "skipped"),
    ]
    for rec in records:
        assert set(REQUIRED) <= set(rec), set(REQUIRED) - set(rec)
        assert set(ENV_KEYS) <= set(rec["env"])
        assert rec["batch"] == 1 and rec["set"] == ["n_layers=1"]
    for rec in (r for r in records if r["status"] == "ok"):
        assert rec["reason"] is None
        assert rec["fwd_ms"] > 0 and rec["fwd_bwd_ms"] > 0 and rec["peak_mib"] >= 0
        assert rec["memory_method"] in ("clear_refs", "maxrss")
        assert 0 < rec["mfu"] and rec["env"]["peak_tflops"] > 0


def test_glob_and_set_apply(cli_run):
    _, records, _, _ = cli_run
    model, attn, sdpa = (r for r in records if r["status"] == "ok")
    assert model["overrides"]["n_layers"] == 1
    one = create_model("vanilla-tiny", n_layers=1)
    assert model["params"] == one.num_params() != create_model("vanilla-tiny").num_params()
    assert attn["params"] == sum(p.numel() for p in one.blocks[0].attn.parameters())
    assert sdpa["params"] == 0


def test_cell_that_cannot_fit_is_skipped_with_reason(cli_run):
    for rec in (r for r in cli_run[1] if r["seq_len"] == 10**6):
        assert rec["status"] == "skipped"
        assert "exceeds" in rec["reason"] and "MiB" in rec["reason"]
        assert rec["fwd_ms"] is None and rec["peak_mib"] is None and rec["est_mib"] > 1e6


def test_cell_flops_match_analytic_count(cli_run):
    _, records, _, _ = cli_run
    c = get_config("vanilla-tiny")
    t, h, dh = 64, c.n_heads, c.head_dim
    assert c.causal
    attn, sdpa = records[2], records[3]
    assert (attn["flops_fwd"], attn["flops_fwd_bwd"]) == dense_attention_flops(1, t, c.dim, h, dh)
    pairs = t * (t + 1) // 2  # causal: the pairs the kernel computes
    assert (sdpa["flops_fwd"], sdpa["flops_fwd_bwd"]) == (4 * h * pairs * dh, 14 * h * pairs * dh)


def test_png_and_table(cli_run):
    _, records, printed, out = cli_run
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "results.jsonl" in printed and "bench.png" in printed
    rows = {tuple(line.split()[:3]): line.split() for line in printed.splitlines()}
    dense, sdpa = rows["attention", "vanilla-tiny", "64"], rows["attention", "sdpa", "64"]
    # columns: part name T B fwd x fwd+bwd x peak x ...; sdpa is the baseline of its length
    assert sdpa[5] == sdpa[7] == "1.00"
    # the printed ratio is computed from the unrounded times (the printed ms are rounded)
    rec = {(r["part"], r["name"], r["seq_len"]): r for r in records if r.get("status") == "ok"}
    ratio = rec["attention", "vanilla-tiny", 64]["fwd_ms"] / rec["attention", "sdpa", 64]["fwd_ms"]
    assert float(dense[5]) == pytest.approx(ratio, abs=0.006)
    assert rows["model", "vanilla-tiny", "64"][5] == "1.00"  # no reference: its own baseline
    assert "skipped: estimated" in " ".join(rows["attention", "vanilla-tiny", "1000000"])


# ------------------------------------------------------------------------------------ FLOPs


@pytest.mark.parametrize("batch,seq_len,causal", [(2, 48, True), (1, 64, False)])
def test_flop_count_of_dense_attention_part_is_analytic(batch, seq_len, causal):
    overrides = bench_overrides("vanilla-tiny", [f"causal={causal}"], seq_len)
    config = get_config("vanilla-tiny", **overrides)
    spec = CellSpec(
        name="vanilla-tiny", config=config, part="attention", seq_len=seq_len, batch=batch,
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    wl = model_workload(create_model("vanilla-tiny", **overrides), spec)
    got = count_flops(wl)
    c = config
    assert got == dense_attention_flops(batch, seq_len, c.dim, c.n_heads, c.head_dim, causal)


# ------------------------------------------------------------------------------------ CLI


def test_glob_selects_names():
    assert resolve_names(["vanilla-t*"]) == ["vanilla-tiny"]
    assert resolve_names(["vanilla-*", "vanilla-tiny"]) == list_models("vanilla-*")
    with pytest.raises(ValueError, match="no registered model matches"):
        resolve_names(["zzz-*"])
    with pytest.raises(KeyError, match="unknown model name"):
        resolve_names(["vanilla-tinyy"])


@pytest.mark.parametrize(
    "args,message",
    [
        (["vanilla-tinyy"], "unknown model name 'vanilla-tinyy'"),
        (["zzz-*"], "no registered model matches"),
        (["vanilla-tiny", "--set", "n_layer=1"], "unknown config key 'n_layer'"),
        (["vanilla-tiny", "--set", "n_layers=two"], "n_layers expects an integer"),
        (["vanilla-tiny", "--refs", "nosuchref"], "no registered reference matches"),
    ],
)
def test_cli_errors_exit_2(args, message, tmp_path, capsys):
    assert main(["bench", *args, "--lengths", "64", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "effiformer bench: error:" in err and message in err


@pytest.mark.parametrize("bad", ["0", "-5", "abc"])
def test_cli_bad_length_exits_2(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "vanilla-tiny", "--lengths", "64", bad, "--out", str(tmp_path)])
    assert e.value.code == 2
    assert (
        f"argument --lengths: expected a positive integer, got '{bad}'" in capsys.readouterr().err
    )


def test_library_rejects_bad_arguments(tmp_path):
    for kwargs, message in [
        (dict(lengths=[0]), "lengths must be positive integers, got 0"),
        (dict(lengths=[64, -3]), "got -3"),
        (dict(lengths=[]), "at least one"),
        (dict(batch=0), "batch must be a positive integer"),
        (dict(dtype="float8"), "dtype must be one of"),
        (dict(parts=("encoder",)), "part must be one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_bench(["vanilla-tiny"], out=tmp_path, **{"lengths": [64], **kwargs})


def test_cuda_unavailable_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "vanilla-tiny", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_max_memory_skips_every_cell_without_running(tmp_path):
    result = run_bench(
        ["vanilla-tiny"], lengths=[64, 128], parts=("model", "attention"), refs=["none"],
        max_memory_mib=0.001, out=tmp_path, measure_peak=False, **FAST,
    )  # fmt: skip
    assert [r["status"] for r in result.records] == ["skipped"] * 4
    for r in result.records:
        assert "--max-memory-mib" in r["reason"] and r["est_mib"] > 0.001
    assert result.records[0]["params"] is None  # never ran
    assert result.plot_path is None  # nothing ran, nothing drawn
    assert "skipped: estimated" in format_table(result.records)


def test_estimate_is_conservative_but_fits_the_default_set():
    c = get_config("vanilla-small")
    t = 4096
    est = estimate_cell_bytes(c, "attention", t, 1, torch.float32)
    assert est >= c.n_heads * t * t * 4  # at least the materialised scores
    model = estimate_cell_bytes(c, "model", t, 1, torch.float32)
    assert est < model < 8 * 2**30  # the default set's largest cell is well under 8 GiB


# ------------------------------------------------------------------------------------ references

PLUGIN = """
import os
import signal

import torch

from effiformer.bench import Workload, register_reference

N_BYTES = {n_bytes}


def alloc(spec):
    w = torch.zeros(1, requires_grad=True)

    def forward():
        buf = torch.ones(N_BYTES // 4)  # float32, every page touched
        return (buf[:1] * w).sum()

    return Workload(forward=forward, inputs=(w,))


def raises(spec):
    raise RuntimeError("boom while building the reference")


def killed(spec):
    def forward():
        os.kill(os.getpid(), signal.SIGKILL)

    return forward


register_reference("vanilla-tiny", alloc, name="test-alloc")
register_reference("vanilla-tiny", raises, name="test-raise")
register_reference("vanilla-tiny", killed, name="test-kill")
register_reference("vanilla-tiny", alloc, name="test-missing", requires=("no_such_pkg_zz",))
"""


def _plugin(tmp_path, n_bytes=1):
    path = tmp_path / "bench_plugin_for_test.py"
    path.write_text(textwrap.dedent(PLUGIN.format(n_bytes=n_bytes)))
    return str(path)


@pytest.mark.parametrize("method", ["clear_refs", "maxrss"])
def test_peak_memory_of_a_known_allocation(method, tmp_path, isolated_refs):
    n = 256 * 2**20
    result = run_bench(
        ["vanilla-tiny"], lengths=[64], parts=("attention",), refs=["test-alloc"], refs_only=True,
        plugins=[_plugin(tmp_path, n)], memory_method=method, out=tmp_path / "o",
        measure_peak=False, plot=False, **FAST,
    )  # fmt: skip
    (rec,) = result.records
    assert rec["status"] == "ok", rec["reason"]
    assert rec["memory_method"] == method
    assert abs(rec["peak_mib"] - n / 2**20) <= 0.1 * n / 2**20, rec["peak_mib"]


def test_crashing_and_uninstalled_references_are_skipped(tmp_path, isolated_refs):
    result = run_bench(
        ["vanilla-tiny"], lengths=[64], parts=("attention",),
        refs=["test-raise", "test-kill", "test-missing"], refs_only=True,
        plugins=[_plugin(tmp_path)], out=tmp_path / "o", measure_peak=False, plot=False, **FAST,
    )  # fmt: skip
    by_name = {r["name"]: r for r in result.records}
    assert [r["status"] for r in result.records] == ["skipped"] * 3
    assert by_name["test-raise"]["reason"] == "RuntimeError: boom while building the reference"
    assert "SIGKILL" in by_name["test-kill"]["reason"]
    assert "no_such_pkg_zz" in by_name["test-missing"]["reason"]
    lines = (tmp_path / "o" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3


def test_list_refs(capsys):
    assert main(["bench", "--list-refs"]) == 0
    out = capsys.readouterr().out
    assert "sdpa" in out and "torch-mha" in out and "torch-nn" in out and "available" in out


def test_register_reference_validates(isolated_refs):
    def factory(spec):
        return lambda: torch.zeros(())

    with pytest.raises(ValueError, match="lowercase and hyphenated"):
        register_reference("vanilla", factory, name="My_Ref")
    with pytest.raises(ValueError, match="parts must be"):
        register_reference("vanilla", factory, name="my-ref", parts=("encoder",))
    ref = register_reference("vanilla", factory, name="my-ref")
    assert register_reference("vanilla", factory, name="my-ref") == ref  # idempotent re-import

    def other(spec):
        return lambda: torch.zeros(())

    with pytest.raises(ValueError, match="already registered"):
        register_reference("vanilla", other, name="my-ref")
    assert ref in references.references_for("vanilla-tiny", "vanilla", "attention")
    assert ref not in references.references_for("vanilla-tiny", "vanilla", "model")
    assert ref not in references.references_for("x-tiny", "other", "attention")


@pytest.mark.gpu
def test_cuda_cells_run_with_allocator_peak(tmp_path, isolated_refs):
    """Deselected by default (-m gpu): the CUDA path end to end, including the allocator peak."""
    n = 256 * 2**20
    (tmp_path / "p").mkdir()
    with open(_plugin(tmp_path / "p", n)) as f:
        source = f.read()
    source = source.replace("torch.ones(N_BYTES // 4)", 'torch.ones(N_BYTES // 4, device="cuda")')
    source = source.replace("torch.zeros(1, ", 'torch.zeros(1, device="cuda", ')
    path = tmp_path / "cuda_plugin.py"
    path.write_text(source)
    result = run_bench(
        ["vanilla-tiny"], lengths=[64], parts=("model", "attention"), refs=["sdpa", "test-alloc"],
        plugins=[str(path)], device="cuda", dtype="bfloat16", out=tmp_path / "o", **FAST,
    )  # fmt: skip
    assert [r["status"] for r in result.records] == ["ok"] * 4, [
        r["reason"] for r in result.records
    ]
    assert all(r["memory_method"] == "cuda_allocator" for r in result.records)
    alloc = next(r for r in result.records if r["name"] == "test-alloc")
    assert abs(alloc["peak_mib"] - 256) <= 25.6
    assert result.records[0]["env"]["device"] == "cuda" and result.records[0]["flops_fwd"] > 0


# ------------------------------------------------------------------------------------ output folder


def test_out_with_results_is_refused_unless_append_or_force(cli_run, capsys):
    _, records, _, out = cli_run
    before = (out / "results.jsonl").read_text()
    argv = ["bench", "vanilla-tiny", "--lengths", "64", "--no-progress", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already holds results" in err
    assert "--append" in err and "--force" in err
    assert (out / "results.jsonl").read_text() == before  # nothing touched
    assert main([*argv, "--append", "--force"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_append_keeps_earlier_records_and_force_replaces_them(tmp_path):
    out = tmp_path / "o"
    # every cell skipped by the memory limit: records written, no cell process started
    kw = dict(refs=["none"], max_memory_mib=0.001, out=out, measure_peak=False, **FAST)
    run_bench(["vanilla-tiny"], lengths=[64], **kw)
    (out / "bench.png").write_bytes(b"stale")
    with pytest.raises(ValueError, match="already holds results"):
        run_bench(["vanilla-tiny"], lengths=[96], **kw)
    run_bench(["vanilla-tiny"], lengths=[96], append=True, **kw)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq_len"] for x in lines] == [64, 96]
    run_bench(["vanilla-tiny"], lengths=[128], force=True, **kw)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq_len"] for x in lines] == [128]
    assert not (out / "bench.png").exists()  # the replaced run's plot went with it


# ------------------------------------------------------------------------------------ MFU and noise


def _rec(name, tflops, **kw):
    return dict(
        name=name, target="m", part="attention", seq_len=64, batch=1, status="ok",
        flops_fwd=int(tflops * 1e12), fwd_ms=1000.0, flops_fwd_bwd=int(tflops * 1e12),
        fwd_bwd_ms=1000.0, **kw,
    )  # fmt: skip


def test_no_cell_reads_over_100_percent_mfu():
    from effiformer.bench.harness import _finalize_peak, _rates

    env = {"peak_tflops": 1.0, "peak_tflops_matmul": 1.0, "peak_source": "matmul"}
    slow, fast = _rec("slow", 0.5), _rec("fast", 1.5)
    for r in (slow, fast):
        _rates(r, env["peak_tflops"])
    assert fast["mfu"] == pytest.approx(1.5)  # against the measured matmul peak alone
    _finalize_peak([slow, fast], env)
    assert env["peak_tflops"] == pytest.approx(1.5) and env["peak_tflops_matmul"] == 1.0
    assert "fast" in env["peak_source"] and "beat the matmul peak" in env["peak_source"]
    assert fast["mfu"] == pytest.approx(1.0) and slow["mfu"] == pytest.approx(1 / 3)
    env2 = {"peak_tflops": 2.0, "peak_tflops_matmul": 2.0, "peak_source": "matmul"}
    _finalize_peak([slow], env2)  # below the peak: nothing raised
    assert env2["peak_tflops"] == 2.0 and env2["peak_source"] == "matmul"
    assert slow["mfu"] == pytest.approx(0.25)


def test_peak_is_the_best_of_several_sizes():
    from effiformer.bench import measure_peak

    best, per_size = measure_peak(torch.device("cpu"), torch.float32, 1, budget_s=0.0)
    assert best == max(per_size.values()) > 0
    assert list(per_size) == ["1024"]  # an exhausted budget stops after the first size


def test_causal_sdpa_is_counted_as_the_pairs_it_computes():
    from effiformer.flops import causal_pairs

    assert causal_pairs(4, 4) == 10 and causal_pairs(2, 5) == 3 and causal_pairs(5, 2) == 9
    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    got = {}
    for what, kw in (("full", {}), ("causal", {"is_causal": True}), ("mask", {"attn_mask": mask})):

        def forward(kw=kw):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)

        got[what] = count_flops(references.Workload(forward=forward, inputs=(q, k, v)))
    per = 2 * 2 * (4 + 4), 2 * 2 * (4 + 4) + 2 * 2 * (3 * 4 + 2 * 4)  # fwd, fwd+bwd per pair
    assert got["full"] == (64 * per[0], 64 * per[1])
    assert got["causal"] == (36 * per[0], 36 * per[1])  # 8 * 9 / 2 pairs
    assert got["mask"] == got["full"]  # an explicit mask: every pair is computed


def test_noisy_cells_are_flagged():
    from effiformer.bench import sample_spread

    assert sample_spread([10.0, 10.5, 11.0]) == pytest.approx(0.1 / 1.05)
    assert sample_spread([5.0]) is None and sample_spread([]) is None
    # the trimmed range (10-90 %) of 10 samples drops the outer ones
    assert sample_spread([1.0] + [10.0] * 8 + [100.0], trimmed=True) == 0.0
    quiet = dict(_rec("quiet", 0.1), fwd_spread=0.05, fwd_bwd_spread=0.1, noisy=False)
    loud = dict(_rec("loud", 0.1), fwd_spread=0.05, fwd_bwd_spread=0.45, noisy=True)
    table = format_table([quiet, loud]).splitlines()
    assert "noisy: samples spread 45% (> 20%)" in next(x for x in table if " loud " in x)
    assert "noisy" not in next(x for x in table if " quiet " in x)


def test_records_carry_spread_and_load(cli_run):
    for rec in (r for r in cli_run[1] if r["status"] == "ok"):
        assert rec["noisy"] is False  # one sample: no spread to judge
        assert rec["fwd_spread"] is None and rec["fwd_bwd_spread"] is None
        assert len(rec["env"]["loadavg"]) == 3 and rec["env"]["peak_by_size"]


# ------------------------------------------------------------------------------------ --set, plugins


def test_set_attention_field_is_recorded(tmp_path):
    """`effiformer bench routing-small --part attention --set attention.window=64`: the cell runs
    and its record holds the attention config as a dict (it used to fail in json.dumps)."""
    result = run_bench(
        ["routing-small"], parts=("attention",), overrides=["attention.window=64"], lengths=[128],
        refs=["none"], out=tmp_path, measure_peak=False, plot=False, **FAST,
    )  # fmt: skip
    (rec,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rec["status"] == "ok", rec["reason"]
    assert result.records[0]["overrides"] == rec["overrides"]
    attention = rec["overrides"]["attention"]
    assert attention["name"] == "routing" and attention["window"] == 64
    # the rest comes from routing-small's own attention config, not the class defaults
    assert attention["routing_heads"] == get_config("routing-small").attention.routing_heads


PLUGIN_MODEL = """
from effiformer.config import replace_config
from effiformer.registry import get_config, register_model

register_model("plugin-test-tiny", replace_config(get_config("vanilla-tiny"), n_layers=1))
"""


def test_plugins_load_before_names_are_resolved(tmp_path, monkeypatch, isolated_refs):
    from effiformer import registry

    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))
    path = tmp_path / "plugin_model_for_test.py"
    path.write_text(PLUGIN_MODEL)
    result = run_bench(
        ["plugin-test-tiny"], lengths=[32], refs=["none"], plugins=[str(path)],
        out=tmp_path / "o", measure_peak=False, plot=False, **FAST,
    )  # fmt: skip
    (rec,) = result.records
    assert rec["name"] == "plugin-test-tiny" and rec["status"] == "ok", rec["reason"]


# ------------------------------------------------------------------------------------ memory models


@pytest.mark.parametrize("name", ["xl-tiny", "compressive-tiny", "adaptive-span-tiny"])
def test_memory_models_run_the_model_row_with_full_memories(name):
    from effiformer.bench.cell import bench_state

    t = 16
    overrides = bench_overrides(name, [], t)
    config = get_config(name, **overrides)
    spec = CellSpec(
        name=name, config=config, part="model", seq_len=t, batch=1, device=torch.device("cpu"),
        dtype=torch.float32,
    )  # fmt: skip
    model = create_model(name, **overrides)
    wl = model_workload(model, spec)
    assert wl.info["model_state"] == "full_memory"
    full = model.blocks.memory.full_state(list(model.blocks), 1, config.dim, "cpu", torch.float32)
    state, _ = bench_state(model, 1, torch.device("cpu"), torch.float32)
    flat = [x for e in state for x in (e if isinstance(e, tuple) else (e,))]
    assert [x.shape for x in flat] == [
        x.shape for e in full for x in (e if isinstance(e, tuple) else (e,))
    ]
    assert wl.info["memory_lens"] == [sum(x.shape[1] for x in e) if isinstance(e, tuple)
                                      else e.shape[1] for e in full]  # fmt: skip
    assert all(n > 0 for n in wl.info["memory_lens"])
    # the memories are attended: where the first state is shorter (XL's are empty), the step
    # costs more than the one a model called without a state would run
    first = [x.shape for e in model.init_state(1) for x in (e if isinstance(e, tuple) else (e,))]
    if first != [x.shape for x in flat]:
        ids = torch.randint(0, config.vocab_size, (1, t))
        bare = dataclasses.replace(wl, forward=lambda: model(ids, targets=ids).total_loss)
        assert count_flops(wl)[0] > count_flops(bare)[0]
    else:
        assert name == "compressive-tiny"  # its first memories are full (zeros) already


def test_stateless_models_record_no_state():
    spec = CellSpec(
        name="vanilla-tiny", config=get_config("vanilla-tiny"), part="model", seq_len=16, batch=1,
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    assert model_workload(create_model("vanilla-tiny"), spec).info == {"model_state": "none"}


# ------------------------------------------------------------------------------------ built-in refs


def test_mechanism_references_are_built_in(capsys):
    names = {r.name for r in references.list_references()}
    assert {"local-attention", "routing-transformer", "span-0.1s", "hf-marian"} <= names
    assert main(["bench", "--list-refs"]) == 0
    out = capsys.readouterr().out
    assert "routing-transformer" in out and "span-0s" in out
    assert len([x for x in out.splitlines() if x.startswith("span-0s ")]) == 1  # one line each


def test_a_missing_builtin_reference_module_is_tolerated(monkeypatch):
    import effiformer.bench as bench

    monkeypatch.setattr(bench, "BUILTIN_REFERENCE_MODULES", ("no_such_references_zz",))
    bench._import_builtin_references()  # not there yet: skipped

    def broken(name, *a):
        raise ModuleNotFoundError("No module named 'zz_dep'", name="zz_dep")

    monkeypatch.setattr(bench.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="zz_dep"):
        bench._import_builtin_references()  # there, but broken: an error


# ------------------------------------------------------------------------------------ decoding


def test_decoding_part_records_encoder_decoder_and_total(tmp_path):
    result = run_bench(
        ["seq2seq-tiny", "vanilla-tiny"], parts=("decoding",), src_lens=[6], beam=2,
        out=tmp_path, measure_peak=False, **{**FAST, "repeats": 2, "warmup": 1},
    )  # fmt: skip
    records = {r["name"]: r for r in result.records}
    ours = records["seq2seq-tiny"]
    assert ours["status"] == "ok", ours["reason"]
    assert (ours["part"], ours["seq_len"], ours["beam"], ours["steps"]) == ("decoding", 6, 2, 6)
    assert ours["total_ms"] >= ours["decoder_ms"] >= 0 and ours["encoder_ms"] > 0
    assert len(ours["total_ms_samples"]) == 2 and ours["repeats"] == 2
    assert ours["flops_decoding"] > ours["flops_encode"] > 0
    from effiformer.flops import mult_adds

    expected = mult_adds(get_config("seq2seq-tiny"), src_len=6, tgt_len=6).total
    assert ours["mult_adds"] == expected and "Mult-Adds" in result.table
    assert "not an encoder-decoder model" in records["vanilla-tiny"]["reason"]
    hf = records["hf-marian"]
    if hf["status"] == "ok":
        assert hf["total_ms"] > 0 and hf["encoder_ms"] is None and hf["flops_decoding"] > 0
    else:
        assert "transformers" in hf["reason"]
    table = result.table
    assert "encoder ms" in table and "seq2seq-tiny" in table and "hf-marian" in table
    assert result.plot_path is None  # decoding cells are not drawn


@pytest.mark.parametrize(
    "args,message",
    [
        (["seq2seq-tiny", "--beam", "3"], "--beam only apply to --part decoding"),
        (["--part", "decoding"], "needs the names of encoder-decoder models"),
        (["seq2seq-tiny", "--part", "decoding", "--lengths", "64"], "--src-len"),
        (["seq2seq-tiny", "--part", "decoding", "--batch", "2"], "drop --batch"),
    ],
)
def test_decoding_flag_errors_exit_2(args, message, tmp_path, capsys):
    assert main(["bench", *args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------ Ctrl-C

SLOW_PLUGIN = """
import time

import torch

from effiformer.bench import Workload, register_reference


def quick(spec):
    w = torch.zeros(1, requires_grad=True)
    return Workload(forward=lambda: (w * 2).sum(), inputs=(w,))


def slow(spec):
    time.sleep(120)


register_reference("vanilla-tiny", quick, name="test-quick")
register_reference("vanilla-tiny", slow, name="test-slow")
"""


def test_ctrl_c_prints_one_line_keeps_finished_cells_and_exits_130(tmp_path):
    plugin = tmp_path / "slow_plugin_for_test.py"
    plugin.write_text(SLOW_PLUGIN)
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "effiformer.cli", "bench", "vanilla-tiny", "--part", "attention"]
    cmd += ["--lengths", "32", "--refs-only", "--refs", "test-quick", "test-slow", "--plugin"]
    cmd += [str(plugin), "--repeats", "1", "--warmup", "0", "--no-progress", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # as from a terminal: a suite started in the background (``cmd &`` without job
        # control) runs with SIGINT ignored, which a child would inherit
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while not (results.is_file() and results.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(1.0)  # the slow cell's process is running now
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Traceback" not in stdout
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "interrupted after 1 of 2 cells" in lines[0], stderr
    (rec,) = [json.loads(x) for x in results.read_text().splitlines()]
    assert rec["name"] == "test-quick" and rec["status"] == "ok"


def test_reference_rows_follow_the_attention_not_the_family():
    """Issue 28 item 8: ``bench sparse-small reformer-small routing-small --part attention`` put
    the LSH rows beside sparse-small (a vanilla-family model) where they could only fail. Rows
    bound to an attention stand beside every model with that attention and no other; with
    several models every reference row is labelled ``name@model``."""
    from effiformer.bench import harness
    from effiformer.bench.report import row_labels

    names = ["sparse-small", "reformer-small", "routing-small", "vanilla-small"]
    rows = {2048: [harness.BenchRow(n, n) for n in names]}
    cells = harness._plan(rows, [], ["attention"], ["*"], False, [], None)
    beside = {n: {c["label"] for c in cells if c["name"] == n and c["reference"]} for n in names}
    lsh = {"reformer-pytorch", "hf-reformer-lsh"}
    assert lsh <= beside["reformer-small"] and not lsh & beside["sparse-small"]
    assert "routing-transformer" in beside["routing-small"]
    assert "routing-transformer" not in beside["sparse-small"] | beside["vanilla-small"]
    assert "local-attention" in beside["sparse-small"]
    assert "local-attention" not in beside["vanilla-small"] | beside["reformer-small"]
    # the attention is the configured one: --set attention=lsh brings the LSH rows to vanilla
    swapped = harness._plan({2048: [harness.BenchRow("vanilla-small", "vanilla-small")]}, [],
                            ["attention"], ["*"], False, ["attention=lsh"], None)  # fmt: skip
    assert lsh <= {c["label"] for c in swapped if c["reference"]}
    recs = [{"name": n, "target": t} for n, t in [("sparse-small", "sparse-small"),
            ("sdpa", "sparse-small"), ("routing-small", "routing-small"),
            ("routing-transformer", "routing-small")]]  # fmt: skip
    assert row_labels(recs) == ["sparse-small", "sdpa@sparse-small", "routing-small",
                                "routing-transformer@routing-small"]  # fmt: skip
    assert row_labels(recs[:2]) == ["sparse-small", "sdpa"]


# ------------------------------------------------------------------------------ the default set


def test_the_default_set_puts_the_mechanisms_side_by_side_against_dense(tmp_path):
    """Issue 28: README command 1 showed dense attention alone (its x column always 1.00). The
    default set is every DEFAULT_MECHANISMS entry in vanilla-small at the quality suite's
    settings for the length, one layer and the whole model, with the ratios against dense."""
    from effiformer.bench import DEFAULT_MECHANISMS, default_rows
    from effiformer.bench.quality import mechanism_settings

    rows = default_rows(4096)
    assert [r.label for r in rows] == list(DEFAULT_MECHANISMS)
    assert [r.label for r in rows if r.baseline] == ["dense"]
    local = next(r for r in rows if r.label == "local")
    assert local.overrides == ("attention=local", "attention.window=512")
    for r in rows:  # every row builds the attention the quality suite trains at that length
        config = get_config(r.name, **bench_overrides(r.name, r.overrides, 4096))
        assert config.attention.name == (mechanism_settings(r.label, "lm", 4096) or {})["name"]
    result = run_bench(
        [], lengths=[4096], max_memory_mib=0.001, out=tmp_path, measure_peak=False, **FAST
    )  # fmt: skip  (plans, runs nothing)
    recs = result.records
    assert [(r["part"], r["name"]) for r in recs] == [
        (p, m) for p in ("model", "attention") for m in DEFAULT_MECHANISMS
    ]
    assert all(r["model"] == "vanilla-small" and r["target"] == r["name"] for r in recs)
    assert [r["name"] for r in recs if r["baseline"]] == ["dense", "dense"]
    assert "x: ratio to the dense row of the same part and length." in format_table(recs)


def test_the_summary_names_the_fastest_and_smallest_and_every_ratio_to_dense():
    from effiformer.bench import format_summary
    from effiformer.bench.report import baselines

    def rec(name, t, mib, base=False):
        return {"kind": "model", "status": "ok", "part": "model", "seq_len": 4096, "batch": 1,
                "name": name, "target": name, "fwd_ms": t / 3, "fwd_bwd_ms": t,
                "peak_mib": mib, "baseline": base}  # fmt: skip

    recs = [rec("dense", 100.0, 400.0, True), rec("local", 50.0, 500.0), rec("lsh", 200.0, 300.0)]
    assert baselines(recs) == [0, 0, 0]  # across targets: every row against dense
    text = format_summary(recs)
    assert "the whole model at 4,096 tokens (forward+backward):" in text
    assert "fastest: local (50.0 ms, 0.50x dense)" in text
    assert "least memory: lsh (300 MiB, 0.75x dense)" in text
    assert "local 0.50x time, 1.25x memory; lsh 2.00x time, 0.75x memory" in text
    assert format_summary(recs[1:]) == ""  # no dense row: nothing to compare against


def test_readme_command_1_runs_the_default_set_then_the_quality_smoke(tmp_path, capsys):
    """The CLI path of README command 1 (the bench cells skipped by a tiny memory limit, so the
    test times nothing): the mechanisms' table, then the quality smoke of the same mechanisms."""
    from effiformer.bench import DEFAULT_MECHANISMS

    out = tmp_path / "b"
    assert main(["bench", "--max-memory-mib", "0.001", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    rows = [line.split()[1] for line in text.splitlines() if line.startswith("model ")]
    assert rows == list(DEFAULT_MECHANISMS)
    assert "quality smoke: MQAR at 64 tokens" in text
    assert f"{len(DEFAULT_MECHANISMS)} of {len(DEFAULT_MECHANISMS)} mechanisms trained" in text
    assert (out / "quality-smoke" / "results.jsonl").is_file()


def test_workload_mult_adds():
    """Analytic Mult-Adds of bench rows: the first self-attention (an encoder-decoder's is its
    encoder's, bidirectional), the whole translation model, the decoding workload's target
    length, unknown families."""
    from effiformer.bench.harness import workload_mult_adds
    from effiformer.flops import seq2seq_mult_adds

    c = get_config("transformer-base")
    assert not c.attention_causal and get_config("vanilla-small").attention_causal
    assert workload_mult_adds(c, "attention", 1024, None) == (
        4 * 1024 * 512 * 512 + 2 * 1024 * 1024 * 512
    )
    assert workload_mult_adds(c, "model", 30, None) == seq2seq_mult_adds(c).total
    assert workload_mult_adds(c, "decoding", 30, 12) == seq2seq_mult_adds(c, tgt_len=12).total
    assert workload_mult_adds(get_config("vanilla-small"), "model", 30, None) is None
    with pytest.raises(ValueError, match="part must be"):
        workload_mult_adds(c, "layers", 30, None)


def test_compiled_cells_record_their_backend_and_compile_time(tmp_path, capsys):
    """``effiformer bench --compile``: the training cells run under ``torch.compile`` (here the
    ``aot_eager`` backend: tracing without code generation), the first call, which compiles, is
    recorded apart (``compile_s``), the FLOPs are the eager workload's, and decoding refuses."""
    result = run_bench(
        ["vanilla-tiny"], lengths=[64], parts=["attention"], repeats=2, warmup=0,
        out=tmp_path / "c", progress=False, plot=False, measure_peak=False, compile="aot_eager",
        refs=["none"],
    )  # fmt: skip
    (rec,) = result.records
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["compile"] == "aot_eager" and rec["compile_s"] > 0 and rec["fwd_bwd_ms"] > 0
    eager = run_bench(
        ["vanilla-tiny"], lengths=[64], parts=["attention"], repeats=2, warmup=0,
        out=tmp_path / "e", progress=False, plot=False, measure_peak=False, refs=["none"],
    ).records[0]  # fmt: skip
    assert eager["compile"] is None and eager["compile_s"] is None
    assert (rec["flops_fwd"], rec["flops_fwd_bwd"]) == (eager["flops_fwd"], eager["flops_fwd_bwd"])
    assert main(["bench", "transformer-multi30k", "--part", "decoding", "--compile"]) == 2
    assert "--compile times training cells" in capsys.readouterr().err
