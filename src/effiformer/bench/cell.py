"""One benchmark cell, run in its own fresh process (``python -m effiformer.bench --cell``).

A fresh process per cell makes the CPU peak-memory figure honest: the process's high-water mark
belongs to this cell alone. The order inside a cell:

1. build the workload (model or reference, inputs) — never timed;
2. with the ``maxrss`` fallback only: measure memory on the very first step (the high-water mark
   cannot be reset, so it is read before any warm-up pushed it up): peak RSS after the step minus
   peak RSS before it, a lower bound when something earlier in the process peaked higher;
3. count FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` on one forward and one
   forward+backward (these two passes double as the first warm-up);
4. ``warmup`` more plain forward and forward+backward passes;
5. measure the peak memory of one forward+backward step: on CPU reset the high-water mark by
   writing ``5`` to ``/proc/self/clear_refs`` after returning freed heap memory to the OS
   (``malloc_trim``), read ``VmRSS`` before the step and ``VmHWM`` after, report HWM - RSS; on
   CUDA ``reset_peak_memory_stats`` and ``max_memory_allocated`` minus allocated before;
6. time ``repeats`` forwards (under ``no_grad``) and ``repeats`` forward+backward steps
   (gradients reset to ``None`` before each, outside the timed region) with
   ``time.perf_counter``, synchronising CUDA before reading the clock; report medians.

FLOPs are what ``FlopCounterMode`` counts (matmuls, convolutions, attention kernels; elementwise
ops are free). PyTorch registers no formula for the CPU flash-attention kernel
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), so this module supplies
one with the same counting as PyTorch's CUDA SDPA formulas: forward ``2·B·H·Tq·Tk·(Dq + Dv)``,
backward ``2·B·H·Tq·Tk·(3·Dq + 2·Dv)``; like them it does not discount causal masking.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import json
import logging
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..config import ModelConfig, parse_overrides
from ..registry import create_model, family_config_class, get_config, get_spec
from .references import CellSpec, Workload, list_references

__all__ = [
    "bench_overrides",
    "model_workload",
    "load_plugin",
    "count_flops",
    "measure_peak_mib",
    "time_ms",
    "run_cell",
    "cell_main",
    "MEMORY_METHODS",
]

logger = logging.getLogger(__name__)

MEMORY_METHODS = ("auto", "clear_refs", "maxrss")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------------------------- configuration


def bench_overrides(name: str, set_items: Iterable[str], seq_len: int) -> dict[str, Any]:
    """The config overrides a cell builds ``name`` with: the parsed ``--set`` items, then
    ``seq_len = max(seq_len, config.seq_len)`` and every ``*dropout`` float field set to 0.0
    unless ``--set`` gave it."""
    cls = family_config_class(get_spec(name).family)
    overrides = parse_overrides(get_spec(name).config, list(set_items))
    base = get_config(name, **overrides)
    extra: dict[str, Any] = {"seq_len": max(seq_len, base.seq_len)}
    for f in cls.field_names():
        if f.endswith("dropout") and f not in overrides and isinstance(getattr(base, f), float):
            extra[f] = 0.0
    return {**overrides, **extra}


def load_plugin(spec: str) -> None:
    """Import a plugin that registers references: a module name or a path to a ``.py`` file."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"--plugin file {spec!r} does not exist")
        modname = "effiformer_bench_plugin_" + "".join(
            ch if ch.isalnum() else "_" for ch in str(path.resolve())
        )
        if modname in sys.modules:
            return
        mspec = importlib.util.spec_from_file_location(modname, path)
        if mspec is None or mspec.loader is None:
            raise ImportError(f"cannot import --plugin file {spec!r}")
        module = importlib.util.module_from_spec(mspec)
        sys.modules[modname] = module
        try:
            mspec.loader.exec_module(module)
        except BaseException:
            del sys.modules[modname]
            raise
    else:
        importlib.import_module(spec)


# ---------------------------------------------------------------------------------- workloads


def model_workload(model: torch.nn.Module, spec: CellSpec) -> Workload:
    """Whole model (``part="model"``: random token ids, ``targets = input_ids``, the loss plus
    auxiliary losses) or one attention layer (``part="attention"``: ``model.attention_part(x)``
    on x (B, T, D) requiring grad, backward of ``.sum()``)."""
    model.to(device=spec.device, dtype=spec.dtype).train()
    c = spec.config
    if spec.part == "model":
        ids = torch.randint(0, c.vocab_size, (spec.batch, spec.seq_len), device=spec.device)

        def forward() -> torch.Tensor:
            out = model(ids, targets=ids)
            if out.loss is None:
                return out.logits.float().mean()
            return out.total_loss

        return Workload(forward=forward, module=model)
    if spec.part == "attention":
        x = torch.randn(spec.batch, spec.seq_len, c.dim, device=spec.device, dtype=spec.dtype)
        x.requires_grad_()  # (B, T, D)
        return Workload(forward=lambda: model.attention_part(x), module=model, inputs=(x,))
    raise ValueError(f"part must be 'model' or 'attention', got {spec.part!r}")


# ---------------------------------------------------------------------------------- measurement


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _fwd_bwd(wl: Workload) -> None:
    wl.step_loss(wl.forward()).backward()


def _fwd(wl: Workload) -> None:
    with torch.no_grad():
        out = wl.forward()
    del out


def time_ms(
    step: Callable[[], None], prepare: Callable[[], None], sync: Callable[[], None], repeats: int
) -> list[float]:
    """``repeats`` wall times in ms of ``step``; ``prepare`` runs before each, outside the clock."""
    samples = []
    for _ in range(repeats):
        prepare()
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def _sdpa_cpu_fwd_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    b, hq, sq, dq = q
    sk, dv = k[2], v[3]
    return 2 * b * hq * sq * sk * (dq + dv)


def _sdpa_cpu_bwd_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    b, hq, sq, dq = q
    sk, dv = k[2], v[3]
    return 2 * b * hq * sq * sk * (3 * dq + 2 * dv)


def _extra_flop_formulas() -> dict[Any, Callable[..., int]]:
    aten = torch.ops.aten
    extra: dict[Any, Callable[..., int]] = {}
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", _sdpa_cpu_fwd_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_cpu_bwd_flops),
    ):
        if hasattr(aten, name):
            extra[getattr(aten, name)] = formula
    return extra


def count_flops(wl: Workload) -> tuple[int, int]:
    """(forward FLOPs, forward+backward FLOPs) of one step, as ``FlopCounterMode`` counts them."""
    extra = _extra_flop_formulas()
    wl.zero_grad()
    with FlopCounterMode(display=False, custom_mapping=extra) as fc:
        _fwd(wl)
    fwd = fc.get_total_flops()
    wl.zero_grad()
    with FlopCounterMode(display=False, custom_mapping=extra) as fc:
        _fwd_bwd(wl)
    return int(fwd), int(fc.get_total_flops())


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _maxrss_kib() -> float:
    """This process's peak RSS in KiB: VmHWM when /proc is readable (its own address space, fresh
    at exec), else ``getrusage`` ``ru_maxrss`` — which on Linux carries the parent's peak across
    fork and exec, so the fallback then undercounts when the parent was larger than the cell."""
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return float(hwm)
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024 if sys.platform == "darwin" else float(r)  # bytes on macOS, KiB on Linux


def resolve_memory_method(method: str, device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda_allocator"
    if method == "auto":
        usable = os.path.exists("/proc/self/clear_refs") and _status_kib("VmHWM") is not None
        return "clear_refs" if usable and _reset_hwm() else "maxrss"
    if method not in MEMORY_METHODS:
        raise ValueError(f"memory_method must be one of {list(MEMORY_METHODS)}, got {method!r}")
    return method


def measure_peak_mib(
    step: Callable[[], None], prepare: Callable[[], None], method: str, device: torch.device
) -> float:
    """Extra memory in MiB one call of ``step`` needs above what is resident before it."""
    prepare()
    gc.collect()
    if method == "cuda_allocator":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    if method == "clear_refs":
        _malloc_trim()
        if not _reset_hwm():
            raise OSError("cannot write /proc/self/clear_refs; use memory_method='maxrss'")
        before = _status_kib("VmRSS")
        step()
        after = _status_kib("VmHWM")
        if before is None or after is None:
            raise OSError("cannot read VmRSS/VmHWM from /proc/self/status")
        return (after - before) / 1024
    if method == "maxrss":
        before = _maxrss_kib()
        step()
        return max(0.0, _maxrss_kib() - before) / 1024
    raise ValueError(f"unknown memory method {method!r}")


# ---------------------------------------------------------------------------------- one cell


def _build(cell: dict[str, Any], spec_args: dict[str, Any]) -> tuple[CellSpec, Workload]:
    name = cell["name"]
    overrides = bench_overrides(name, cell["set"], cell["seq_len"])
    config: ModelConfig = get_config(name, **overrides)
    spec = CellSpec(name=name, config=config, **spec_args)
    if cell["reference"] is None:
        return spec, model_workload(create_model(name, **overrides), spec)
    ref_name, target = cell["reference"]
    module = cell.get("reference_module")
    if module and module != "__main__" and module not in sys.modules:
        importlib.import_module(module)
    for ref in list_references():
        if ref.name == ref_name and ref.target == target:
            return spec, ref.build(spec)
    raise KeyError(f"reference {ref_name!r} for {target!r} is not registered in the cell process")


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Measure one cell described by ``cell`` (the JSON the parent writes) and return the
    measurements: fwd_ms, fwd_bwd_ms (medians) and their samples, peak_mib, memory_method,
    flops_fwd, flops_fwd_bwd, params."""
    device = torch.device(cell["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available")
    torch.set_num_threads(int(cell["threads"]))
    torch.manual_seed(0)
    random.seed(0)
    for plugin in cell.get("plugins", []):
        load_plugin(plugin)
    spec_args = dict(
        part=cell["part"],
        seq_len=cell["seq_len"],
        batch=cell["batch"],
        device=device,
        dtype=DTYPES[cell["dtype"]],
    )
    spec, wl = _build(cell, spec_args)
    sync = _sync(device)
    step = lambda: _fwd_bwd(wl)  # noqa: E731
    method = resolve_memory_method(cell.get("memory_method", "auto"), device)
    peak = None
    if method == "maxrss":  # first step, before warm-up raises the unresettable mark
        peak = measure_peak_mib(step, wl.zero_grad, method, device)
    flops_fwd, flops_fwd_bwd = count_flops(wl)
    params = wl.params_with_grad()
    for _ in range(int(cell["warmup"])):
        _fwd(wl)
        wl.zero_grad()
        step()
    if peak is None:
        peak = measure_peak_mib(step, wl.zero_grad, method, device)
    fwd = time_ms(lambda: _fwd(wl), lambda: None, sync, int(cell["repeats"]))
    fwd_bwd = time_ms(step, wl.zero_grad, sync, int(cell["repeats"]))
    return {
        "fwd_ms": statistics.median(fwd),
        "fwd_ms_samples": fwd,
        "fwd_bwd_ms": statistics.median(fwd_bwd),
        "fwd_bwd_ms_samples": fwd_bwd,
        "peak_mib": peak,
        "memory_method": method,
        "flops_fwd": flops_fwd,
        "flops_fwd_bwd": flops_fwd_bwd,
        "params": params,
    }


def _die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this cell if the harness process dies first, so an
    interrupted run leaves no orphan cell behind. Best effort elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get("EFFIFORMER_BENCH_PARENT")
    if parent and parent.isdigit() and os.getppid() != int(parent):  # died before prctl
        sys.exit(1)


def _parse_cell_argv(argv: list[str]) -> tuple[Path, Path]:
    """``--cell CELL.json --result RESULT.json`` (both required, in any order). The harness
    spawns this entry; people run ``effiformer bench`` (parsing is the CLI's job)."""
    usage = "usage: python -m effiformer.bench --cell CELL.json --result RESULT.json"
    values: dict[str, str] = {}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag not in ("--cell", "--result") or not rest:
            raise SystemExit(f"{usage}\n(this is the per-cell entry of `effiformer bench`)")
        values[flag] = rest.pop(0)
    if set(values) != {"--cell", "--result"}:
        raise SystemExit(f"{usage}\n(this is the per-cell entry of `effiformer bench`)")
    return Path(values["--cell"]), Path(values["--result"])


def cell_main(argv: list[str]) -> int:
    """``python -m effiformer.bench --cell CELL.json --result RESULT.json``: run one cell and
    write its measurements (or ``{"error": ...}``) to RESULT.json. Exit 0 on success, 1 on error."""
    cell_path, result_path = _parse_cell_argv(argv)
    _die_with_parent()
    cell = json.loads(cell_path.read_text())
    try:
        result: dict[str, Any] = run_cell(cell)
        code = 0
    except Exception as e:  # reported to the parent as a skipped cell, never raised further
        traceback.print_exc(file=sys.stderr)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result = {"error": f"{type(e).__name__}: {msg}"[:500]}
        code = 1
    result_path.write_text(json.dumps(result))
    return code
