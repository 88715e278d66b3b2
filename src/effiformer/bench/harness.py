"""The harness behind ``effiformer bench``: plan the cells, run each in a fresh process, collect the
records, write ``results.jsonl`` and the plot.

For registered model names (or globs) it measures, per cell (name x part x length):

- ``fwd_ms``: median wall time of a forward under ``no_grad`` (model in train mode, dropout 0);
- ``fwd_bwd_ms``: median wall time of forward + backward (gradients reset to ``None`` before each
  step, outside the clock) — ``time.perf_counter``, ``torch.cuda.synchronize`` on CUDA, after
  warm-up; model building, input creation and FLOP counting are never inside the timed region;
- ``peak_mib``: the extra memory one forward+backward step needs above what is resident before
  it: on CPU the process's high-water mark (``/proc/self/clear_refs`` reset, VmHWM - VmRSS), with
  the ``getrusage`` max-RSS difference on the first step as a fallback; on CUDA the allocator's
  peak (``max_memory_allocated`` minus allocated before). ``memory_method`` records which;
- ``flops_fwd`` / ``flops_fwd_bwd``: ``torch.utils.flop_counter.FlopCounterMode`` counts, and
  ``mfu`` / ``mfu_fwd``: achieved FLOP/s over the machine's matmul peak measured once per run
  (``env.peak_tflops``: fastest of several 2048² matmuls on CPU, 8192² on CUDA, in the run's
  dtype);
- ``params``: parameters that receive a gradient in the step (the attention layer's alone for
  ``--part attention``);
- ``mult_adds``: the analytic Mult-Adds of the workload's forward (:func:`effiformer.flops.bench_mult_adds`:
  the first layer's self-attention for ``--part attention``, a translation model over
  ``seq_len`` source and target tokens for ``--part model``; ``None`` where it is not known and
  for reference rows).

Every cell runs in its own fresh process (``python -m effiformer.bench --cell``), so a cell
that dies (exception, OOM killer) becomes a skipped record with the reason, and the CPU high-water
mark belongs to that cell alone. Before a cell starts, its memory is estimated conservatively
(materialised attention scores and their gradients, activations, weights and gradients) and the
cell is skipped with the reason when the estimate exceeds the available memory
(``/proc/meminfo`` MemAvailable minus 1 GiB, or CUDA free memory minus 512 MiB) or
``max_memory_mib``.

Reference rows (``sdpa``, ``torch-mha``, ``torch-nn`` and whatever plug-ins register with
:func:`register_reference`) are timed beside the models at the same shapes; see
:mod:`effiformer.bench.references`.

Output: ``OUT/results.jsonl`` (one record per cell, each carrying the environment: torch and Python
versions, device name, threads, dtype, git sha, measured peak), an aligned text table, and
``OUT/bench.png`` (time and memory against length, log-log, one line per row).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..flops import bench_mult_adds
from ..registry import build_model, get_config, get_spec, list_models
from .cell import DTYPES, MEMORY_METHODS, bench_overrides, load_plugin
from .references import (
    PARTS,
    CellSpec,
    Reference,
    list_references,
    missing_requirements,
    references_for,
)
from .report import format_table, plot_results

__all__ = [
    "DEFAULT_NAMES",
    "DEFAULT_LENGTHS",
    "DEFAULT_REFS",
    "BenchResult",
    "run_bench",
    "resolve_names",
    "estimate_cell_bytes",
    "environment",
    "measure_peak_tflops",
]

logger = logging.getLogger(__name__)

DEFAULT_NAMES = ("vanilla-small",)
DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096)
DEFAULT_REFS = ("sdpa",)
RESULTS = "results.jsonl"
PLOT = "bench.png"
CPU_RESERVE_MIB = 1024
CUDA_RESERVE_MIB = 512

MEASURED = (
    "fwd_ms", "fwd_ms_samples", "fwd_bwd_ms", "fwd_bwd_ms_samples", "peak_mib", "memory_method",
    "flops_fwd", "flops_fwd_bwd", "tflops_fwd", "tflops_fwd_bwd", "mfu_fwd", "mfu", "cell_s",
)  # fmt: skip


@dataclass
class BenchResult:
    records: list[dict[str, Any]]
    results_path: Path
    plot_path: Path | None
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def table(self) -> str:
        return format_table(self.records)


# ---------------------------------------------------------------------------------- environment


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo_mib(key: str) -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def measure_peak_tflops(device: torch.device, dtype: torch.dtype, threads: int) -> float:
    """Best achieved TFLOP/s of a square matmul (2048 on CPU, 8192 on CUDA) in ``dtype``: the
    fastest of several runs after two warm-ups, since a peak is what the machine can do and
    interference from other processes only ever slows a run down."""
    n, repeats = (8192, 10) if device.type == "cuda" else (2048, 8)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        times = []
        for i in range(repeats + 2):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return 2 * n**3 / min(times) / 1e12


def environment(device: torch.device, dtype: str, threads: int, *, peak: bool = True) -> dict:
    """What every record carries: versions, device, threads, dtype, git sha, matmul peak."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        mem_total = torch.cuda.get_device_properties(device).total_memory / 2**20
    else:
        device_name = _cpu_name()
        mem_total = _meminfo_mib("MemTotal")
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "effiformer": __version__,
        "git_sha": _git_sha(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "mem_total_mib": mem_total,
        "threads": threads,
        "dtype": dtype,
        "peak_tflops": measure_peak_tflops(device, DTYPES[dtype], threads) if peak else None,
        "peak_method": (
            f"fastest {'8192' if device.type == 'cuda' else '2048'}^2 {dtype} matmul of 8+"
            if peak
            else None
        ),
    }


# ---------------------------------------------------------------------------------- planning


def resolve_names(patterns: Iterable[str]) -> list[str]:
    """Registered names for exact names and globs, in the order given, without duplicates.
    An unknown exact name raises ``KeyError`` (closest names listed); a glob that matches nothing
    raises ``ValueError``."""
    names: list[str] = []
    for pat in patterns:
        if any(ch in pat for ch in "*?["):
            found = list_models(pat)
            if not found:
                raise ValueError(f"no registered model matches {pat!r} (see `effiformer list`)")
        else:
            get_spec(pat)  # KeyError naming the closest registered names
            found = [pat]
        names.extend(n for n in found if n not in names)
    return names


def _elt(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimate_cell_bytes(
    config: Any, part: str, seq_len: int, batch: int, dtype: torch.dtype, params: int | None = None
) -> int:
    """A conservative estimate of the memory one cell needs (bytes), for deciding to skip it.

    Assumes attention scores are materialised (B·H·T² for the scores and again for their
    gradient) in every layer, activations of ~(12·D + 4·F) per token per layer kept for backward,
    weights plus gradients, and float32 logits with their gradient and softmax for whole models.
    Fused kernels need far less; this only guards against cells that cannot fit.
    """
    c = config
    e = _elt(dtype)
    b, t = batch, seq_len
    d, h, f = c.dim, c.n_heads, c.ffn_dim
    if params is None:
        params = 12 * c.n_layers * d * d + c.vocab_size * d
    scores = 2 * b * h * t * t * e
    if part == "attention":
        return 2 * params * e // max(c.n_layers, 1) + 8 * b * t * max(d, c.inner_dim) * e + scores
    per_layer = b * t * (12 * max(d, c.inner_dim) + 4 * f) * e + scores
    logits = 3 * b * t * c.vocab_size * 4
    return 2 * params * e + logits + c.n_layers * per_layer


def _available_mib(device: torch.device) -> tuple[float | None, str]:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free / 2**20 - CUDA_RESERVE_MIB, f"CUDA free memory minus {CUDA_RESERVE_MIB} MiB"
    avail = _meminfo_mib("MemAvailable")
    if avail is None:
        return None, "unknown"
    return avail - CPU_RESERVE_MIB, f"MemAvailable minus {CPU_RESERVE_MIB} MiB"


def _meta_model(name: str, overrides: dict[str, Any]) -> torch.nn.Module | None:
    """The model built on the meta device (no memory), or None when its builder cannot."""
    try:
        with torch.device("meta"):
            return build_model(get_config(name, **overrides))
    except Exception as e:  # noqa: BLE001 - any builder failure only loses the estimate
        logger.debug("cannot build %s on the meta device (%s); estimating from the config", name, e)
        return None


def _has_attention_part(model: torch.nn.Module) -> bool:
    from ..models.base import EffiModel

    fn = getattr(type(model), "attention_part", None)
    return fn is not None and fn is not EffiModel.attention_part


# ---------------------------------------------------------------------------------- running


def _blank_record(**kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = dict(kw)
    env = rec.pop("env")
    rec.update({k: None for k in MEASURED if k not in rec})
    rec["env"] = env  # last: the long part
    return rec


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _run_cell_process(cell: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Run one cell in a fresh Python process; always returns a dict (``error`` on failure)."""
    with tempfile.TemporaryDirectory(prefix="effiformer-cell-") as tmp:
        cell_path, result_path = Path(tmp, "cell.json"), Path(tmp, "result.json")
        cell_path.write_text(json.dumps(cell))
        env = dict(os.environ)
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["EFFIFORMER_BENCH_PARENT"] = str(os.getpid())
        if cell["device"] == "cpu":
            env["OMP_NUM_THREADS"] = str(cell["threads"])
        cmd = [sys.executable, "-m", "effiformer.bench", "--cell", str(cell_path),
               "--result", str(result_path)]  # fmt: skip
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"cell process timed out after {timeout:g} s (--cell-timeout)"}
        wall = time.perf_counter() - t0
        result = None
        if result_path.is_file():
            try:
                result = json.loads(result_path.read_text())
            except json.JSONDecodeError:
                result = None
        if proc.returncode == 0 and result is not None and "error" not in result:
            return {**result, "cell_s": wall}
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:]
        if result is not None and "error" in result:
            return {"error": result["error"]}
        if proc.returncode < 0:
            why = f"cell process killed by {_signal_name(proc.returncode)}"
            if -proc.returncode == signal.SIGKILL:
                why += " (likely the out-of-memory killer)"
        else:
            why = f"cell process exited with code {proc.returncode}"
        if tail:
            why += f": {tail[0].strip()[:300]}"
        return {"error": why}


def run_bench(
    names: Sequence[str] = (),
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    batch: int = 1,
    parts: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    repeats: int = 5,
    warmup: int = 1,
    out: str | os.PathLike = "bench-out",
    refs: Sequence[str] | None = None,
    refs_only: bool = False,
    plugins: Sequence[str] = (),
    max_memory_mib: float | None = None,
    memory_method: str = "auto",
    cell_timeout: float | None = 1800.0,
    progress: bool = True,
    plot: bool = True,
    measure_peak: bool = True,
) -> BenchResult:
    """Benchmark ``names`` (registered names or globs) at ``lengths`` and write ``out``.

    With no ``names``: the default set, :data:`DEFAULT_NAMES` with both parts and the ``sdpa``
    reference only. ``parts`` defaults to ``("model",)`` when names are given. ``overrides`` are
    ``KEY=VALUE`` config items (as ``--set``). ``refs`` are globs over reference names
    (``("none",)`` for none; default: every matching reference, ``sdpa`` only for the default set);
    ``refs_only`` drops the model rows.
    Returns every record; skipped cells are records with ``status="skipped"`` and a ``reason``.
    """
    for v, what in ((batch, "batch"), (repeats, "repeats")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths must name at least one sequence length")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"lengths must be positive integers, got {length!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if memory_method not in MEMORY_METHODS:
        raise ValueError(
            f"memory_method must be one of {list(MEMORY_METHODS)}, got {memory_method!r}"
        )
    if max_memory_mib is not None and max_memory_mib <= 0:
        raise ValueError(f"max_memory_mib must be > 0, got {max_memory_mib!r}")
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine")
    if threads is None:
        threads = torch.get_num_threads()
    elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    if parts is None:
        parts = PARTS if not names else ("model",)
    for p in parts:
        if p not in PARTS:
            raise ValueError(f"part must be one of {list(PARTS)}, got {p!r}")
    if refs is None:
        refs = ("*",) if names else DEFAULT_REFS
    names = resolve_names(names) if names else list(DEFAULT_NAMES)
    for plugin in plugins:
        load_plugin(plugin)
    ref_patterns = [] if list(refs) == ["none"] else list(refs)
    all_refs = list_references()
    for pat in ref_patterns:
        if not any(fnmatch.fnmatchcase(r.name, pat) for r in all_refs):
            known = sorted({r.name for r in all_refs})
            raise ValueError(f"no registered reference matches {pat!r}; registered: {known}")
    set_items = list(overrides)
    for name in names:  # parse errors (unknown keys, bad values) before anything runs
        get_config(name, **bench_overrides(name, set_items, 1))

    cells = _plan(names, lengths, parts, ref_patterns, refs_only, set_items)
    if not cells:
        raise ValueError("nothing to run: no model rows (refs_only) and no matching references")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(dev, dtype, threads, peak=measure_peak)
    common = dict(
        batch=batch, device=str(dev), dtype=dtype, threads=threads, repeats=repeats,
        warmup=warmup, memory_method=memory_method, plugins=list(plugins),
    )  # fmt: skip
    if max_memory_mib is not None:
        limit, limit_why = float(max_memory_mib), "--max-memory-mib"
    else:
        limit, limit_why = _available_mib(dev)

    from tqdm.auto import tqdm

    records: list[dict[str, Any]] = []
    results_path = out_dir / RESULTS
    meta_cache: dict[tuple[str, int], torch.nn.Module | None] = {}
    with (
        open(results_path, "w") as fh,
        tqdm(
            total=len(cells), desc="bench", unit="cell", file=sys.stderr, disable=not progress
        ) as bar,
    ):
        for c in cells:
            bar.set_postfix_str(f"{c['label']} {c['part']} T={c['seq_len']}")
            rec = _measure(c, common, env, limit, limit_why, meta_cache, cell_timeout)
            records.append(rec)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            bar.update(1)
    plot_path = out_dir / PLOT if plot and plot_results(records, out_dir / PLOT) else None
    return BenchResult(records=records, results_path=results_path, plot_path=plot_path, env=env)


def _plan(names, lengths, parts, ref_patterns, refs_only, set_items) -> list[dict[str, Any]]:
    cells = []
    for part in parts:
        for length in lengths:
            for name in names:
                family = get_spec(name).family
                base = dict(name=name, family=family, part=part, seq_len=length, set=set_items)
                if not refs_only:
                    cells.append(dict(base, label=name, reference=None))
                for ref in references_for(name, family, part):
                    if any(fnmatch.fnmatchcase(ref.name, p) for p in ref_patterns):
                        cells.append(dict(base, label=ref.name, reference=ref))
    return cells


def _measure(c, common, env, limit, limit_why, meta_cache, timeout) -> dict[str, Any]:
    ref: Reference | None = c["reference"]
    name, part, length, batch = c["name"], c["part"], c["seq_len"], common["batch"]
    overrides = bench_overrides(name, c["set"], length)
    config = get_config(name, **overrides)
    rec = _blank_record(
        name=c["label"],
        kind="model" if ref is None else "reference",
        target=name,
        family=c["family"],
        part=part,
        seq_len=length,
        batch=batch,
        device=common["device"],
        dtype=common["dtype"],
        status="ok",
        reason=None,
        params=None,
        est_mib=None,
        baseline=bool(ref is not None and ref.baseline),
        set=list(c["set"]),
        overrides=dict(overrides),
        mult_adds=None if ref is not None else bench_mult_adds(config, part, length),
        env=env,
    )
    if ref is not None:
        missing = missing_requirements(ref)
        if missing:
            rec.update(status="skipped", reason=(
                f"needs the package(s) {', '.join(missing)}, not installed "
                "(pip install 'effiformer[reference]' or the package)"
            ))  # fmt: skip
            return rec
    key = (name, length)
    if key not in meta_cache:
        meta_cache[key] = _meta_model(name, overrides)
    meta = meta_cache[key]
    params = sum(p.numel() for p in meta.parameters()) if meta is not None else None
    if ref is None and part == "attention" and meta is not None and not _has_attention_part(meta):
        rec.update(status="skipped", reason=f"{type(meta).__name__} exposes no attention_part")
        return rec
    dt = DTYPES[common["dtype"]]
    if ref is not None and ref.estimate_bytes is not None:
        spec = CellSpec(name=name, config=config, part=part, seq_len=length, batch=batch,
                        device=torch.device("meta"), dtype=dt)  # fmt: skip
        est = ref.estimate_bytes(spec)
    else:
        est = estimate_cell_bytes(config, part, length, batch, dt, params)
    rec["est_mib"] = est / 2**20
    if limit is not None and rec["est_mib"] > limit:
        rec.update(status="skipped", reason=(
            f"estimated {rec['est_mib']:.0f} MiB exceeds the {limit:.0f} MiB limit ({limit_why})"
        ))  # fmt: skip
        return rec
    cell = dict(
        common,
        name=name,
        part=part,
        seq_len=length,
        set=c["set"],
        reference=None if ref is None else [ref.name, ref.target],
        reference_module=None if ref is None else ref.module,
    )
    result = _run_cell_process(cell, timeout)
    if "error" in result:
        rec.update(status="skipped", reason=result["error"])
        return rec
    rec.update(result)
    peak = env.get("peak_tflops")
    for tag, flops, ms in (("fwd", rec["flops_fwd"], rec["fwd_ms"]),
                           ("fwd_bwd", rec["flops_fwd_bwd"], rec["fwd_bwd_ms"])):  # fmt: skip
        tflops = flops / (ms / 1e3) / 1e12 if ms and ms > 0 else None
        rec[f"tflops_{tag}"] = tflops
        mfu = tflops / peak if tflops is not None and peak else None
        rec["mfu_fwd" if tag == "fwd" else "mfu"] = mfu
    return rec
