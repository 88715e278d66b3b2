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
- ``flops_fwd`` / ``flops_fwd_bwd``: ``torch.utils.flop_counter.FlopCounterMode`` counts (a
  causal SDPA call counted as the pairs it computes, see :mod:`.cell`), and ``mfu`` /
  ``mfu_fwd``: achieved FLOP/s over the machine's peak (``env.peak_tflops``): the fastest
  square matmul of several sizes (1024-3072 on CPU, 4096-16384 on CUDA, in the run's dtype and
  thread count, best of several runs each: interference only ever slows a run down), raised to
  the fastest cell's own FLOP/s when a cell beat it (``env.peak_source`` says so), so that no
  cell reads over 100%;
- ``fwd_spread`` / ``fwd_bwd_spread``: (max - min) / median of the timed samples, and
  ``noisy``: a spread over 20% (:data:`NOISY_SPREAD`) in either; the table notes it;
- ``params``: parameters that receive a gradient in the step (the attention layer's alone for
  ``--part attention``);
- ``mult_adds``: the analytic Mult-Adds of the workload's forward
  (:func:`workload_mult_adds`, from :mod:`effiformer.flops`: the first layer's self-attention for
  ``--part attention``, a translation model over ``seq_len`` source and target tokens for
  ``--part model``, over ``seq_len`` source and ``steps`` target tokens, teacher-forced, for
  ``--part decoding``; ``None`` where it is not known and for reference rows);
- the whole model row of a memory model (XL, Compressive, Adaptive Span) runs against full
  memories (``model_state: "full_memory"``, ``memory_lens``), the same memories its attention
  row attends over: a segment in the middle of a stream.

``--part decoding`` (encoder-decoder models): ``encoder_ms``, ``decoder_ms``, ``total_ms`` of
translating one sentence of ``seq_len`` source tokens with beam ``beam`` for ``steps`` decoder
steps (:func:`effiformer.bench.decoding.decoding_latency`, HAT's measurement: 10-90 % trimmed
means of ``repeats`` runs after ``warmup``, default 20 and 5), ``total_ms_samples``,
``total_spread`` (over the trimmed runs), ``flops_encode`` / ``flops_decoding`` (one encoder
pass / one whole beam search, all beams).

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
versions, device name, threads, dtype, git sha, peak, load average), an aligned text table, and
``OUT/bench.png`` (time and memory against length, log-log, one line per row). A folder that
already holds results is refused unless ``append`` (add this run's records; the plot shows
all) or ``force`` (replace them). Records are written as cells finish; on Ctrl-C the finished
ones stay and :class:`BenchInterrupted` (a ``KeyboardInterrupt``) carries them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import platform
import signal
import statistics
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
from ..attention.base import AttentionDims
from ..flops import attention_mult_adds, mult_adds
from ..registry import build_model, get_config, get_spec, list_models
from .cell import (
    DTYPES,
    INTERRUPTED,
    MEMORY_METHODS,
    bench_overrides,
    is_encoder_decoder,
    load_plugin,
)
from .references import (
    PARTS,
    TRAINING_PARTS,
    CellSpec,
    Reference,
    list_references,
    missing_requirements,
    references_for,
)
from .report import NOISY_SPREAD, format_table, plot_results

__all__ = [
    "BenchRow",
    "workload_mult_adds",
    "DEFAULT_MECHANISMS",
    "DEFAULT_SET_LENGTHS",
    "DEFAULT_SET_REPEATS",
    "DEFAULT_SET_WARMUP",
    "default_rows",
    "DEFAULT_NAMES",
    "DEFAULT_LENGTHS",
    "DEFAULT_REFS",
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "DECODING_RUNS",
    "DECODING_WARMUP",
    "NOISY_SPREAD",
    "BenchResult",
    "BenchInterrupted",
    "OutputExistsError",
    "sample_spread",
    "run_bench",
    "resolve_names",
    "estimate_cell_bytes",
    "environment",
    "measure_peak_tflops",
]

logger = logging.getLogger(__name__)

DEFAULT_NAMES = ("vanilla-small",)
DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096)
#: The default set (``effiformer bench`` with no names): these attention mechanisms, each in
#: :data:`DEFAULT_NAMES`' model at its settings for the length (the quality suite's
#: :data:`~effiformer.bench.quality.MECHANISMS`, language-modelling settings), one layer and the
#: whole model, forward and forward+backward, at :data:`DEFAULT_SET_LENGTHS`.
DEFAULT_MECHANISMS = ("dense", "local", "sparse-fixed", "routing", "lsh", "adaptive-span")
DEFAULT_SET_LENGTHS = (4096,)
#: timed runs and plain warm-up runs of the default set (its two FLOP-counting passes warm up)
DEFAULT_SET_REPEATS = 3
DEFAULT_SET_WARMUP = 0
#: references of the default set: none (its baseline is the dense row; ``--refs sdpa`` adds the
#: bare SDPA call beside each layer)
DEFAULT_REFS = ("none",)
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 1
#: HAT's latency measurement (``latency_dataset.py``): 5 warm-up runs, then 20 timed.
DECODING_RUNS = 20
DECODING_WARMUP = 5
DEFAULT_SRC_LENS = (30,)
DEFAULT_BEAM = 5
RESULTS = "results.jsonl"
PLOT = "bench.png"
CPU_RESERVE_MIB = 1024
CUDA_RESERVE_MIB = 512

MEASURED = (
    "fwd_ms", "fwd_ms_samples", "fwd_bwd_ms", "fwd_bwd_ms_samples", "fwd_spread",
    "fwd_bwd_spread", "noisy", "peak_mib", "memory_method", "flops_fwd", "flops_fwd_bwd",
    "tflops_fwd", "tflops_fwd_bwd", "mfu_fwd", "mfu", "cell_s", "compile", "compile_s",
)  # fmt: skip
DECODING_MEASURED = (
    "beam", "steps", "encoder_ms", "decoder_ms", "total_ms", "total_ms_samples", "total_spread",
    "noisy", "flops_encode", "flops_decoding", "cell_s",
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


class OutputExistsError(FileExistsError, ValueError):
    """The output folder already holds results and neither ``append`` nor ``force`` was given."""


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_bench`: ``result`` holds the cells that finished (already in
    ``results.jsonl``), ``total`` the number of cells planned."""

    def __init__(self, result: BenchResult, total: int) -> None:
        super().__init__(f"interrupted after {len(result.records)} of {total} cells")
        self.result, self.total = result, total


def sample_spread(samples: Sequence[float] | None, *, trimmed: bool = False) -> float | None:
    """(max - min) / median of timing samples (of the 10-90 % range that
    :func:`~effiformer.bench.decoding.trimmed_mean` averages when ``trimmed``); ``None`` for
    fewer than two samples."""
    if not samples or len(samples) < 2:
        return None
    v = sorted(samples)
    if trimmed:
        a = int(len(v) * 0.1)
        v = v[a : max(int(len(v) * 0.9), a + 1)]
        if len(v) < 2:
            return None
    med = statistics.median(v)
    return (v[-1] - v[0]) / med if med > 0 else None


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


PEAK_SIZES = {"cpu": (1024, 2048, 3072), "cuda": (4096, 8192, 16384)}
PEAK_BUDGET_S = {"cpu": 1.5, "cuda": 2.0}
PEAK_RUNS = (2, 10)  # timed runs per size: at least, at most


def measure_peak(
    device: torch.device, dtype: torch.dtype, threads: int, *, budget_s: float | None = None
) -> tuple[float, dict[str, float]]:
    """The machine's matmul peak in TFLOP/s and the best per size: square matmuls of
    :data:`PEAK_SIZES` in ``dtype`` with ``threads`` intra-op threads (as the cells run), each
    size one warm-up and then 2 to 10 timed runs within its share of the time budget (sizes
    after the budget is spent are left out); the best run of the best size, since interference
    from other processes only ever slows a run down."""
    kind = "cuda" if device.type == "cuda" else "cpu"
    sizes = PEAK_SIZES[kind]
    budget = PEAK_BUDGET_S[kind] if budget_s is None else budget_s
    least, most = PEAK_RUNS
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    per_size: dict[str, float] = {}
    start = time.perf_counter()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        gen = torch.Generator(device=device).manual_seed(0)
        for k, n in enumerate(sizes):
            if k and time.perf_counter() - start > budget:
                break
            share_end = start + budget * (k + 1) / len(sizes)
            a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
            b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
            torch.mm(a, b)  # warm-up
            sync()
            best = float("inf")
            for i in range(most):
                if i >= least and time.perf_counter() > share_end:
                    break
                t0 = time.perf_counter()
                torch.mm(a, b)
                sync()
                best = min(best, time.perf_counter() - t0)
            per_size[str(n)] = 2 * n**3 / best / 1e12
            del a, b
    finally:
        torch.set_num_threads(old)
    return max(per_size.values()), per_size


def measure_peak_tflops(device: torch.device, dtype: torch.dtype, threads: int) -> float:
    """The matmul peak of :func:`measure_peak` (TFLOP/s)."""
    return measure_peak(device, dtype, threads)[0]


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(device: torch.device, dtype: str, threads: int, *, peak: bool = True) -> dict:
    """What every record carries: versions, device, threads, dtype, git sha, load average
    (1, 5, 15 min, before the run), matmul peak."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        mem_total = torch.cuda.get_device_properties(device).total_memory / 2**20
    else:
        device_name = _cpu_name()
        mem_total = _meminfo_mib("MemTotal")
    env = {
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
        "loadavg": _loadavg(),
        "peak_tflops": None,
        "peak_tflops_matmul": None,
        "peak_by_size": None,
        "peak_method": None,
        "peak_source": None,
    }
    if peak:
        best, per_size = measure_peak(device, DTYPES[dtype], threads)
        sizes = PEAK_SIZES["cuda" if device.type == "cuda" else "cpu"]
        env.update(
            peak_tflops=best,
            peak_tflops_matmul=best,
            peak_by_size=per_size,
            peak_method=(
                f"fastest square {dtype} matmul of sizes {', '.join(map(str, sizes))} "
                f"({threads} threads), best of several runs each"
            ),
            peak_source="matmul",
        )
    return env


# ---------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class BenchRow:
    """One model row: the registered ``name`` built with ``overrides`` (``KEY=VALUE`` items, as
    ``--set``, applied after the run's own) and shown as ``label``."""

    label: str
    name: str
    overrides: tuple[str, ...] = ()
    #: the row the table's ratios are taken against (across every row of a part and length)
    baseline: bool = False


def default_rows(length: int) -> list[BenchRow]:
    """The default set's rows at ``length``: every :data:`DEFAULT_MECHANISMS` entry in
    ``DEFAULT_NAMES[0]``, with the attention settings the quality suite gives it for language
    modelling at that length (local window T/8, sparse stride ~sqrt(T), LSH chunks of 64 with 2
    hashes, sqrt(T) routing clusters, adaptive spans up to T)."""
    from .mechanisms import mechanism_settings

    rows = []
    for m in DEFAULT_MECHANISMS:
        att = mechanism_settings(m, "lm", length) or {"name": "dense"}
        items = [f"attention={att['name']}"]
        items += [f"attention.{k}={v}" for k, v in att.items() if k != "name"]
        rows.append(BenchRow(m, DEFAULT_NAMES[0], tuple(items), baseline=m == "dense"))
    return rows


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
    """Whether the model is built on the attention interface (``--part attention`` captures
    its first attention call: :func:`~effiformer.bench.cell.capture_attention_call`)."""
    from ..attention.base import AttentionPart

    return any(isinstance(m, AttentionPart) for m in model.modules())


# ---------------------------------------------------------------------------------- running


def _blank_record(**kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = dict(kw)
    env = rec.pop("env")
    measured = DECODING_MEASURED if rec.get("part") == "decoding" else MEASURED
    rec.update({k: None for k in measured if k not in rec})
    rec["env"] = env  # last: the long part
    return rec


def _jsonable(v: Any) -> Any:
    """Config values as JSON: nested configs (``AttentionConfig``) through their ``to_dict``."""
    to_dict = getattr(v, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict())
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _jsonable(dataclasses.asdict(v))
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, torch.dtype):
        return str(v)
    return v


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _run_cell_process(cell: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Run one cell in a fresh Python process; always returns a dict (``error`` on failure).
    Raises ``KeyboardInterrupt`` when the cell was stopped by SIGINT (Ctrl-C)."""
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
        if proc.returncode in (INTERRUPTED, -signal.SIGINT):
            raise KeyboardInterrupt
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


def _positive(v: Any, what: str, *, zero: bool = False) -> None:
    lo = 0 if zero else 1
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        kind = "an integer >= 0" if zero else "a positive integer"
        raise ValueError(f"{what} must be {kind}, got {v!r}")


def _read_records(path: Path) -> list[str]:
    """The non-empty lines of an earlier ``results.jsonl`` (kept verbatim when appending)."""
    return [ln for ln in path.read_text().splitlines() if ln.strip()]


def _parse_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for ln in lines:
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "status" in rec and "part" in rec:
            out.append(rec)
    return out


def _write_atomic(path: Path, lines: Sequence[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(ln + "\n" for ln in lines))
    os.replace(tmp, path)


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
    repeats: int | None = None,
    warmup: int | None = None,
    out: str | os.PathLike = "bench-out",
    append: bool = False,
    force: bool = False,
    refs: Sequence[str] | None = None,
    refs_only: bool = False,
    plugins: Sequence[str] = (),
    max_memory_mib: float | None = None,
    memory_method: str = "auto",
    cell_timeout: float | None = 1800.0,
    progress: bool = True,
    plot: bool = True,
    measure_peak: bool = True,
    src_lens: Sequence[int] = DEFAULT_SRC_LENS,
    beam: int = DEFAULT_BEAM,
    steps: int | None = None,
    compile: str | None = None,
) -> BenchResult:
    """Benchmark ``names`` (registered names or globs) at ``lengths`` and write ``out``.

    With no ``names``: the default set, every :data:`DEFAULT_MECHANISMS` entry in
    :data:`DEFAULT_NAMES`' model (:func:`default_rows`, at each length; pass
    :data:`DEFAULT_SET_LENGTHS` for the command line's), parts model and attention, no
    references, the ratios against the ``dense`` row. ``parts`` defaults to ``("model",)`` when names are given;
    ``"decoding"`` times whole translations of encoder-decoder models at the source lengths
    ``src_lens`` with ``beam`` and ``steps`` decoder steps (default: the source length).
    ``repeats`` / ``warmup``: timed and warm-up runs per cell (default 5 and 1; for decoding
    20 and 5, HAT's). ``overrides`` are ``KEY=VALUE`` config items (as ``--set``). ``refs`` are
    globs over reference names (``("none",)`` for none; default: every matching reference,
    none for the default set); ``refs_only`` drops the model rows. ``plugins`` are
    imported first (they may register models as well as references).

    ``out`` must not hold results already unless ``append`` (add to them) or ``force``
    (replace them): :class:`OutputExistsError` otherwise. Ctrl-C raises
    :class:`BenchInterrupted` with the finished cells (already written).
    Returns every record; skipped cells are records with ``status="skipped"`` and a ``reason``.
    """
    _positive(batch, "batch")
    if repeats is not None:
        _positive(repeats, "repeats")
    if warmup is not None:
        _positive(warmup, "warmup", zero=True)
    _positive(beam, "beam")
    if steps is not None:
        _positive(steps, "steps")
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths must name at least one sequence length")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"lengths must be positive integers, got {length!r}")
    src_lens = list(src_lens)
    if not src_lens or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in src_lens
    ):
        raise ValueError(f"src_lens must be positive integers, got {src_lens!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if memory_method not in MEMORY_METHODS:
        raise ValueError(
            f"memory_method must be one of {list(MEMORY_METHODS)}, got {memory_method!r}"
        )
    if max_memory_mib is not None and max_memory_mib <= 0:
        raise ValueError(f"max_memory_mib must be > 0, got {max_memory_mib!r}")
    if append and force:
        raise ValueError("--append and --force exclude each other")
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
        parts = TRAINING_PARTS if not names else ("model",)
    parts = list(parts)
    for p in parts:
        if p not in PARTS:
            raise ValueError(f"part must be one of {list(PARTS)}, got {p!r}")
    if "decoding" in parts and not names:
        raise ValueError(
            "--part decoding needs the names of encoder-decoder models (e.g. transformer-base)"
        )
    if refs is None:
        refs = ("*",) if names else DEFAULT_REFS
    for plugin in plugins:  # first: a plugin may register the models it is asked for
        load_plugin(plugin)
    default_set = not names
    names = resolve_names(names) if names else list(DEFAULT_NAMES)
    rows_at = {
        length: default_rows(length) if default_set else [BenchRow(n, n) for n in names]
        for length in lengths
    }
    ref_patterns = [] if list(refs) == ["none"] else list(refs)
    all_refs = list_references()
    for pat in ref_patterns:
        if not any(fnmatch.fnmatchcase(r.name, pat) for r in all_refs):
            known = sorted({r.name for r in all_refs})
            raise ValueError(f"no registered reference matches {pat!r}; registered: {known}")
    set_items = list(overrides)
    for rows in rows_at.values():  # parse errors (unknown keys, bad values) before anything runs
        for row in rows:
            get_config(row.name, **bench_overrides(row.name, [*set_items, *row.overrides], 1))

    cells = _plan(rows_at, src_lens, parts, ref_patterns, refs_only, set_items, steps)
    if not cells:
        raise ValueError("nothing to run: no model rows (refs_only) and no matching references")
    out_dir = Path(out)
    results_path = out_dir / RESULTS
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file, not a folder")
    earlier: list[str] = []
    if results_path.is_file() and results_path.stat().st_size > 0:
        if append:
            earlier = _read_records(results_path)
        elif not force:
            raise OutputExistsError(
                f"{out_dir} already holds results ({results_path}); pass --append to add this "
                "run's cells to them or --force to replace them"
            )
    env = environment(dev, dtype, threads, peak=measure_peak)
    common = dict(
        batch=batch, device=str(dev), dtype=dtype, threads=threads, memory_method=memory_method,
        plugins=list(plugins), beam=beam, compile=compile,
    )  # fmt: skip
    runs = {
        "training": (
            repeats
            if repeats is not None
            else (DEFAULT_SET_REPEATS if default_set else DEFAULT_REPEATS),
            warmup
            if warmup is not None
            else (DEFAULT_SET_WARMUP if default_set else DEFAULT_WARMUP),
        ),  # fmt: skip
        "decoding": (
            DECODING_RUNS if repeats is None else repeats,
            DECODING_WARMUP if warmup is None else warmup,
        ),
    }
    if max_memory_mib is not None:
        limit, limit_why = float(max_memory_mib), "--max-memory-mib"
    else:
        limit, limit_why = _available_mib(dev)

    from ..progress import progress_bar, progress_enabled

    out_dir.mkdir(parents=True, exist_ok=True)
    if force:
        (out_dir / PLOT).unlink(missing_ok=True)
    records: list[dict[str, Any]] = []
    meta_cache: dict[tuple[str, int], torch.nn.Module | None] = {}
    interrupted = False
    try:
        with (
            open(results_path, "a" if append else "w") as fh,
            progress_enabled(progress),
            progress_bar(len(cells), desc="bench", unit="cell", leave=True) as bar,
        ):  # fmt: skip
            for c in cells:
                bar.set_postfix_str(f"{c['label']} {c['part']} T={c['seq_len']}")
                n_rep, n_warm = runs["decoding" if c["part"] == "decoding" else "training"]
                cell_common = dict(common, repeats=n_rep, warmup=n_warm)
                rec = _measure(c, cell_common, env, limit, limit_why, meta_cache, cell_timeout)
                records.append(rec)
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
    _finalize_peak(records, env)
    _write_atomic(results_path, [*earlier, *(json.dumps(r) for r in records)])
    if interrupted:
        result = BenchResult(records=records, results_path=results_path, plot_path=None, env=env)
        raise BenchInterrupted(result, len(cells))
    plotted = _parse_lines(earlier) + records
    plot_path = out_dir / PLOT if plot and plot_results(plotted, out_dir / PLOT) else None
    return BenchResult(records=records, results_path=results_path, plot_path=plot_path, env=env)


def _plan(
    rows_at: dict[int, list[BenchRow]],
    src_lens,
    parts,
    ref_patterns,
    refs_only,
    set_items,
    steps,
) -> list[dict[str, Any]]:
    """The cells: for every part and length, each row (``rows_at[length]``; decoding takes the
    first length's rows at every source length) and the references that stand beside it."""
    cells = []
    first = next(iter(rows_at.values()))
    for part in parts:
        for length in src_lens if part == "decoding" else rows_at:
            for row in first if part == "decoding" else rows_at[length]:
                name, items = row.name, [*set_items, *row.overrides]
                family = get_spec(name).family
                config = get_config(name, **bench_overrides(name, items, length))
                attention = getattr(getattr(config, "attention", None), "name", None)
                base = dict(name=name, family=family, part=part, seq_len=length, set=items,
                            target=row.label)  # fmt: skip
                if part == "decoding":
                    base["steps"] = length if steps is None else steps
                if not refs_only:
                    cells.append(dict(base, label=row.label, reference=None,
                                      baseline=row.baseline))  # fmt: skip
                for ref in references_for(name, family, part, attention):
                    if any(fnmatch.fnmatchcase(ref.name, p) for p in ref_patterns):
                        cells.append(dict(base, label=ref.name, reference=ref))
    return cells


def _rates(rec: dict[str, Any], peak: float | None) -> None:
    if rec.get("part") == "decoding":
        return
    for tag, mfu_key in (("fwd", "mfu_fwd"), ("fwd_bwd", "mfu")):
        flops, ms = rec.get(f"flops_{tag}"), rec.get(f"{tag}_ms")
        tflops = flops / (ms / 1e3) / 1e12 if flops is not None and ms and ms > 0 else None
        rec[f"tflops_{tag}"] = tflops
        rec[mfu_key] = tflops / peak if tflops is not None and peak else None


def _finalize_peak(records: list[dict[str, Any]], env: dict[str, Any]) -> None:
    """Raise ``env.peak_tflops`` to the fastest cell's FLOP/s when a cell beat the measured
    matmul peak (the machine can evidently do that much), and recompute every MFU with it."""
    matmul = env.get("peak_tflops_matmul")
    if not matmul:
        return
    best, who = matmul, None
    for r in records:
        if r.get("status") != "ok":
            continue
        for tag in ("fwd", "fwd_bwd"):
            t = r.get(f"tflops_{tag}")
            if t is not None and t > best:
                best, who = t, (r, tag)
    if who is not None:
        r, tag = who
        env["peak_tflops"] = best
        env["peak_source"] = (
            f"cell {r['name']} {r['part']} T={r['seq_len']} {tag.replace('_', '+')} "
            f"({best:.3f} TFLOP/s) beat the matmul peak ({matmul:.3f})"
        )
    for r in records:
        _rates(r, env.get("peak_tflops"))


def workload_mult_adds(config: Any, part: str, length: int, steps: int | None) -> int | None:
    """Analytic Mult-Adds (:mod:`effiformer.flops`) of a model row, batch 1; ``None`` where
    unknown. ``attention``: the first layer's self-attention over ``length`` tokens (any config
    whose ``attention`` part counts itself; causal as ``config.attention_causal`` says);
    ``model``: the whole model with ``length`` source and target tokens and ``decoding``: with
    ``steps`` target tokens (the families :func:`~effiformer.flops.mult_adds` counts)."""
    if part == "attention":
        att = getattr(config, "attention", None)
        if att is None:
            return None
        dims = AttentionDims(
            config.dim, config.n_heads, config.head_dim, causal=config.attention_causal,
            layer=0, n_layers=config.n_layers, max_len=config.seq_len,
        )  # fmt: skip
        try:
            return attention_mult_adds(att, dims, length, length)
        except (ValueError, KeyError):
            return None
    if part not in ("model", "decoding"):
        raise ValueError(f"part must be 'attention', 'model' or 'decoding', got {part!r}")
    m = mult_adds(config, src_len=length, tgt_len=steps if part == "decoding" else None)
    return None if m is None else m.total


def _measure(c, common, env, limit, limit_why, meta_cache, timeout) -> dict[str, Any]:
    ref: Reference | None = c["reference"]
    name, part, length = c["name"], c["part"], c["seq_len"]
    decoding = part == "decoding"
    batch = 1 if decoding else common["batch"]
    fit = max(length, c["steps"] + 1) if decoding else length
    overrides = bench_overrides(name, c["set"], fit)
    config = get_config(name, **overrides)
    extra = dict(beam=common["beam"], steps=c["steps"]) if decoding else {}
    rec = _blank_record(
        name=c["label"],
        kind="model" if ref is None else "reference",
        target=c.get("target", name),
        model=name,
        family=c["family"],
        part=part,
        seq_len=length,
        batch=batch,
        **extra,
        device=common["device"],
        dtype=common["dtype"],
        status="ok",
        reason=None,
        params=None,
        est_mib=None,
        baseline=bool(ref.baseline if ref is not None else c.get("baseline", False)),
        set=list(c["set"]),
        overrides=_jsonable(overrides),
        repeats=common["repeats"],
        warmup=common["warmup"],
        mult_adds=None
        if ref is not None
        else workload_mult_adds(config, part, length, c.get("steps")),
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
    key = (name, fit)
    if key not in meta_cache:
        meta_cache[key] = _meta_model(name, overrides)
    meta = meta_cache[key]
    params = sum(p.numel() for p in meta.parameters()) if meta is not None else None
    if ref is None and part == "attention" and meta is not None and not _has_attention_part(meta):
        rec.update(status="skipped", reason=(
            f"{type(meta).__name__} has no attention part (it does not use the attention "
            "interface)"))  # fmt: skip
        return rec
    if ref is None and decoding and meta is not None and not is_encoder_decoder(meta):
        rec.update(status="skipped", reason=(
            f"{type(meta).__name__} is not an encoder-decoder model (--part decoding needs "
            "encode, init_decoding_state, decode_step and reorder_decoding_state)"
        ))  # fmt: skip
        return rec
    dt = DTYPES[common["dtype"]]
    est_part, est_len, est_batch = (
        ("model", fit, common["beam"]) if decoding else (part, length, batch)
    )
    if ref is not None and ref.estimate_bytes is not None:
        spec = CellSpec(name=name, config=config, part=part, seq_len=length, batch=batch,
                        device=torch.device("meta"), dtype=dt, beam=common["beam"],
                        steps=c.get("steps"))  # fmt: skip
        est = ref.estimate_bytes(spec)
    else:
        est = estimate_cell_bytes(config, est_part, est_len, est_batch, dt, params)
    rec["est_mib"] = est / 2**20
    if limit is not None and rec["est_mib"] > limit:
        rec.update(status="skipped", reason=(
            f"estimated {rec['est_mib']:.0f} MiB exceeds the {limit:.0f} MiB limit ({limit_why})"
        ))  # fmt: skip
        return rec
    cell = dict(
        common,
        batch=batch,
        name=name,
        part=part,
        seq_len=length,
        steps=c.get("steps"),
        set=c["set"],
        reference=None if ref is None else [ref.name, ref.target],
        reference_module=None if ref is None else ref.module,
    )
    result = _run_cell_process(cell, timeout)
    if "error" in result:
        rec.update(status="skipped", reason=result["error"])
        return rec
    rec.update(result)
    if decoding:
        rec["total_spread"] = sample_spread(rec.get("total_ms_samples"), trimmed=True)
        spreads = [rec["total_spread"]]
    else:
        rec["fwd_spread"] = sample_spread(rec.get("fwd_ms_samples"))
        rec["fwd_bwd_spread"] = sample_spread(rec.get("fwd_bwd_ms_samples"))
        spreads = [rec["fwd_spread"], rec["fwd_bwd_spread"]]
    rec["noisy"] = any(x is not None and x > NOISY_SPREAD for x in spreads)
    _rates(rec, env.get("peak_tflops"))
    return rec
