"""The benchmark harness: records, errors, skips, memory accounting and FLOP counts.

Nothing here asserts a time. Cells run in fresh processes (a few seconds each for the imports),
so the tests share runs and keep to ~7 cell processes in all.
"""

from __future__ import annotations

import contextlib
import io
import json
import textwrap

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


def dense_attention_flops(b: int, t: int, d: int, h: int, dh: int) -> tuple[int, int]:
    """What FlopCounterMode counts for DenseAttention on x (B, T, D), SDPA counted dense (T x T).

    forward: Q, K, V projections 3 * 2*B*T*D*(H*Dh), output projection 2*B*T*(H*Dh)*D,
             Q K^T and A V 2 * 2*B*H*T*T*Dh.
    backward: every projection twice more (grad of its input and of its weight), SDPA backward
              5 matmuls (scores recomputed, dA, dV, dQ, dK) 5 * 2*B*H*T*T*Dh.
    """
    inner = h * dh
    proj = 8 * b * t * d * inner
    attn = 4 * b * h * t * t * dh
    return proj + attn, 3 * proj + attn + 10 * b * h * t * t * dh


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
    attn, sdpa = records[2], records[3]
    assert (attn["flops_fwd"], attn["flops_fwd_bwd"]) == dense_attention_flops(1, t, c.dim, h, dh)
    assert (sdpa["flops_fwd"], sdpa["flops_fwd_bwd"]) == (4 * h * t * t * dh, 14 * h * t * t * dh)


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
    assert got == dense_attention_flops(batch, seq_len, config.dim, config.n_heads, config.head_dim)


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
