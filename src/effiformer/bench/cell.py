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

FLOPs are :func:`effiformer.flops.counted_flops`: what ``FlopCounterMode`` counts (matmuls,
convolutions, attention kernels; elementwise ops are free), with formulas for every SDPA kernel
(CPU flash; CUDA flash, memory-efficient, cuDNN; forward and backward) that count the (query,
key) pairs the kernel computes: PyTorch registers none for the CPU flash kernel, and its CUDA
formulas count a causal call as if every pair were computed. The fused kernels skip the masked
blocks (a causal CPU SDPA call at T = 4096 takes 0.55x the time of a full one), so counting them
would credit work no kernel does and put MFU over 100%. An explicit mask (``attn_mask``) is
counted in full: the kernel computes every pair and masks afterwards.

``--part decoding`` (encoder-decoder models) runs
:func:`effiformer.bench.decoding.decoding_latency` instead: one sentence of ``seq_len`` source
tokens, beam ``beam``, exactly ``steps`` decoder steps, ``warmup`` then ``repeats`` timed runs
(10-90 % trimmed mean), encoder and decoder time apart; a decoding reference's workload
(``forward`` = one whole translation) is timed the same way, total only.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig, parse_overrides
from ..flops import counted_flops
from ..registry import create_model, family_config_class, get_config, get_spec
from .references import CellSpec, Workload, list_references

__all__ = [
    "bench_overrides",
    "bench_state",
    "is_encoder_decoder",
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
#: Exit status of a cell process stopped by SIGINT (Ctrl-C), as a shell reports it.
INTERRUPTED = 130
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


def bench_state(
    model: torch.nn.Module,
    batch: int,
    device: torch.device,
    dtype: torch.dtype,
    generator: torch.Generator | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The state the whole-model row runs with, and what to record about it.

    A model may define ``bench_state(batch, device, dtype)`` (returning its state, or ``None``);
    otherwise a model whose layer stack has a memory policy (``model.blocks.memory``: XL's
    FIFO memory, the Compressive memory, Adaptive Span's span-sized memories) gets every layer's
    memory at its full configured length (``memory.full_state``, what ``--part attention``
    attends over), filled with standard-normal values: a segment in the middle of a stream, not
    the first one (whose memories are empty). Everything else: ``None``.

    Returns ``(state, info)``; ``info`` is ``{"model_state": "none" | "full_memory" | "hook",
    "memory_lens": [per-layer lengths] (full memory only)}``.
    """
    hook = getattr(model, "bench_state", None)
    if callable(hook):
        state = hook(batch, device, dtype)
        return state, {"model_state": "hook" if state is not None else "none"}
    memory = getattr(getattr(model, "blocks", None), "memory", None)
    if memory is None or not hasattr(memory, "full_state"):
        return None, {"model_state": "none"}
    blocks = list(model.blocks)
    dim = model.config.dim
    zeros = memory.full_state(blocks, batch, dim, device, dtype)

    def fill(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return torch.randn(t.shape, device=device, dtype=dtype, generator=generator)
        return tuple(fill(x) for x in t)

    def length(entry: Any) -> int:  # (B, M, D) or a tuple of them (Compressive: mem, cmem)
        if isinstance(entry, torch.Tensor):
            return int(entry.shape[1])
        return sum(length(x) for x in entry)

    state = tuple(fill(e) for e in zeros)
    return state, {"model_state": "full_memory", "memory_lens": [length(e) for e in zeros]}


class _Captured(Exception):
    """Raised by the capturing hook: the forward stops at the first attention call."""


class NoAttentionCall(ValueError):
    """The model has no attention part, or its forward called none."""


@dataclass
class AttentionCall:
    """One attention layer as the model calls it: ``module`` (the first
    :class:`~effiformer.attention.base.AttentionPart` the model's forward called) with the
    keyword arguments it got (mask, prepared positions, memory keys ...); ``x`` (B, T, D)
    requiring grad replaces its hidden states. ``forward()`` -> the layer's output (B, T, D);
    where the positions came from the part's ``prepare`` (once per forward in the model),
    ``prepare`` runs it again in every call, so that its cost is counted as before."""

    module: torch.nn.Module
    x: torch.Tensor
    args: tuple
    kwargs: dict[str, Any]
    info: dict[str, Any]
    prepare: Callable[[], Any] | None = None

    def forward(self) -> torch.Tensor:
        kw = dict(self.kwargs)
        if self.prepare is not None:  # the per-forward preparation, as the model runs it
            kw["positions"] = self.prepare()
        kv = kw.get("kv")
        if self.info.get("kv_ends_with_x"):  # memory ++ segment: the segment is x
            kw["kv"] = torch.cat([kv[:, : kv.shape[1] - self.x.shape[1]], self.x], dim=1)
        return self.module(self.x, *self.args, **kw).out


def capture_attention_call(
    model: torch.nn.Module,
    batch: int,
    seq_len: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> AttentionCall:
    """The first attention call of one forward of ``model`` (training mode, random token ids of
    ``seq_len``, the state of :func:`bench_state`: full memories), captured by forward pre-hooks
    on every attention part; the forward stops there. Any model built on the attention interface
    has one, whatever its structure (Funnel's relative positions, the Reformer's reversible
    stack, XL's memory), with no per-model code. Where the keys are memory ++ segment (they end
    with the captured hidden states) the new ``x`` takes the segment's place, so the backward
    reaches ``x`` through the keys as in the model."""
    from ..attention.base import AttentionPart

    parts = [m for m in model.modules() if isinstance(m, AttentionPart)]
    if not parts:
        raise NoAttentionCall(f"{type(model).__name__} has no attention part")
    got: dict[str, Any] = {}

    def hook(module, args, kwargs):
        got.update(module=module, args=args, kwargs=kwargs)
        raise _Captured

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in parts]
    prepared: list[tuple[Callable[[], Any], Any]] = []  # (how to redo it, what it returned)

    def watch(m: torch.nn.Module) -> None:
        bound = m.prepare

        def prepare(ctx, shared):
            out = bound(ctx, shared)
            prepared.append((lambda: bound(ctx, shared), out))
            return out

        m.prepare = prepare  # an instance attribute shadows the method until deleted below

    for m in parts:
        watch(m)
    g = torch.Generator(device=device).manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq_len), device=device, generator=g)
    state, info = bench_state(model, batch, torch.device(device), dtype, g)
    try:
        with torch.no_grad():
            model(ids, targets=ids, **({} if state is None else {"state": state}))
    except _Captured:
        pass
    finally:
        for h in handles:
            h.remove()
        for m in parts:
            del m.prepare
    if not got:
        raise NoAttentionCall(f"{type(model).__name__}'s forward called no attention part")
    args, kwargs = got["args"], dict(got["kwargs"])
    if args:
        hidden, args = args[0], tuple(args[1:])
    else:
        hidden = kwargs.pop("x")
    x = torch.randn(hidden.shape, device=hidden.device, dtype=hidden.dtype)
    x.requires_grad_()
    kv = kwargs.get("kv")
    ends = (
        isinstance(kv, torch.Tensor)
        and kv.shape[1] >= hidden.shape[1]
        and torch.equal(kv[:, kv.shape[1] - hidden.shape[1] :], hidden)
    )
    redo = next((f for f, out in prepared if out is kwargs.get("positions") is not None), None)
    info = {**info, "attention_module": type(got["module"]).__name__, "kv_ends_with_x": ends,
            "prepare_per_call": redo is not None}  # fmt: skip
    return AttentionCall(got["module"], x, args, kwargs, info, redo)


def model_workload(model: torch.nn.Module, spec: CellSpec) -> Workload:
    """Whole model (``part="model"``: random token ids, ``targets = input_ids``, the loss plus
    auxiliary losses, with the state of :func:`bench_state`: full memories for memory models)
    or one attention layer (``part="attention"``: the model's first attention part as the model
    calls it, :func:`capture_attention_call`, on x (B, T, D) requiring grad, backward of
    ``.sum()``)."""
    model.to(device=spec.device, dtype=spec.dtype).train()
    c = spec.config
    if spec.part == "model":
        g = torch.Generator(device=spec.device).manual_seed(0)
        ids = torch.randint(
            0, c.vocab_size, (spec.batch, spec.seq_len), device=spec.device, generator=g
        )
        state, info = bench_state(model, spec.batch, spec.device, spec.dtype, g)
        kwargs = {} if state is None else {"state": state}

        def forward() -> torch.Tensor:
            out = model(ids, targets=ids, **kwargs)
            if out.loss is None:
                return out.logits.float().mean()
            return out.total_loss

        return Workload(forward=forward, module=model, info=info)
    if spec.part == "attention":
        call = capture_attention_call(model, spec.batch, spec.seq_len, spec.device, spec.dtype)
        return Workload(forward=call.forward, module=model, inputs=(call.x,), info=call.info)
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


def count_flops(wl: Workload) -> tuple[int, int]:
    """(forward FLOPs, forward+backward FLOPs) of one step, as
    :func:`effiformer.flops.counted_flops` counts them."""
    wl.zero_grad()
    fwd = counted_flops(lambda: _fwd(wl))
    wl.zero_grad()
    return fwd, counted_flops(lambda: _fwd_bwd(wl))


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


def _build(cell: dict[str, Any], spec_args: dict[str, Any]) -> tuple[CellSpec, Workload | Any]:
    """The cell's spec and its workload: a :class:`Workload`, or for the model row of
    ``part="decoding"`` the model itself (timed by :func:`decoding_latency`)."""
    name = cell["name"]
    overrides = bench_overrides(name, cell["set"], cell["seq_len"])
    config: ModelConfig = get_config(name, **overrides)
    spec = CellSpec(name=name, config=config, **spec_args)
    if cell["reference"] is None:
        model = create_model(name, **overrides)
        if spec.part == "decoding":
            return spec, model.to(device=spec.device, dtype=spec.dtype)
        return spec, model_workload(model, spec)
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
    flops_fwd, flops_fwd_bwd, params, and the workload's ``info``; for ``part="decoding"`` see
    :func:`run_decoding_cell`."""
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
        beam=int(cell.get("beam", 1)),
        steps=cell.get("steps"),
    )
    spec, wl = _build(cell, spec_args)
    if spec.part == "decoding":
        return run_decoding_cell(spec, wl, int(cell["warmup"]), int(cell["repeats"]))
    sync = _sync(device)
    step = lambda: _fwd_bwd(wl)  # noqa: E731
    method = resolve_memory_method(cell.get("memory_method", "auto"), device)
    peak = None
    if method == "maxrss":  # first step, before warm-up raises the unresettable mark
        peak = measure_peak_mib(step, wl.zero_grad, method, device)
    try:
        flops_fwd, flops_fwd_bwd = count_flops(wl)  # of the eager workload, compiled or not
    except Exception as e:  # FLOPs are a column of the table, not a reason to lose the cell
        flops_fwd = flops_fwd_bwd = None
        logger.warning("FLOPs not counted (%s: %s); timing the cell anyway", type(e).__name__, e)
    backend, compile_s = cell.get("compile"), None
    if backend is not None:  # the first call compiles (forward and backward): timed apart
        wl.forward = torch.compile(wl.forward, backend=backend)
        wl.zero_grad()
        t0 = time.perf_counter()
        step()
        sync()
        compile_s = time.perf_counter() - t0
    for _ in range(int(cell["warmup"])):
        _fwd(wl)
        wl.zero_grad()
        step()
    if peak is None:
        peak = measure_peak_mib(step, wl.zero_grad, method, device)
    fwd = time_ms(lambda: _fwd(wl), lambda: None, sync, int(cell["repeats"]))
    fwd_bwd = time_ms(step, wl.zero_grad, sync, int(cell["repeats"]))
    params = wl.params_with_grad()  # after a timed step: the parameters it gave a gradient
    return {
        **dict(wl.info),
        "fwd_ms": statistics.median(fwd),
        "fwd_ms_samples": fwd,
        "fwd_bwd_ms": statistics.median(fwd_bwd),
        "fwd_bwd_ms_samples": fwd_bwd,
        "peak_mib": peak,
        "memory_method": method,
        "flops_fwd": flops_fwd,
        "flops_fwd_bwd": flops_fwd_bwd,
        "params": params,
        "compile": backend,
        "compile_s": compile_s,
    }


#: What :func:`effiformer.generation.beam_search` calls on a model.
DECODING_METHODS = ("encode", "init_decoding_state", "decode_step", "reorder_decoding_state")


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` has the incremental encoder-decoder interface beam search needs."""
    return all(callable(getattr(model, m, None)) for m in DECODING_METHODS)


@torch.inference_mode()
def run_decoding_cell(spec: CellSpec, built: Any, warmup: int, runs: int) -> dict[str, Any]:
    """``part="decoding"``. The model row: :func:`~effiformer.bench.decoding.decoding_latency`
    (encoder, decoder and total ms, trimmed means) and the FLOPs of one encoder pass and of one
    whole beam search. A reference (a :class:`Workload` whose ``forward`` translates once):
    ``warmup`` untimed and ``runs`` timed calls, total ms only (the same trimmed mean)."""
    from .decoding import decoding_latency, trimmed_mean

    steps = spec.seq_len if spec.steps is None else spec.steps
    out: dict[str, Any] = {"beam": spec.beam, "steps": steps}
    if isinstance(built, Workload):
        sync = _sync(spec.device)
        out["flops_decoding"] = counted_flops(built.forward)
        for _ in range(warmup):
            built.forward()
        samples = time_ms(built.forward, lambda: None, sync, runs)
        params = 0 if built.module is None else sum(p.numel() for p in built.module.parameters())
        return {
            **dict(built.info), **out, "total_ms": trimmed_mean(samples),
            "total_ms_samples": samples, "params": params,
        }  # fmt: skip
    model = built
    if not is_encoder_decoder(model):
        raise ValueError(
            f"--part decoding needs an encoder-decoder model (encode + beam search); "
            f"{type(model).__name__} has none"
        )
    from ..generation import beam_search

    lat = decoding_latency(
        model, src_len=spec.seq_len, beam=spec.beam, steps=steps, warmup=warmup, runs=runs
    )
    g = torch.Generator().manual_seed(0)
    cfg = model.config
    src = torch.randint(max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1, cfg.vocab_size,
                        (1, spec.seq_len), generator=g)  # fmt: skip
    src[0, -1] = cfg.eos_id
    src = src.to(spec.device)
    was_training = model.training
    model.eval()
    try:
        flops_encode = counted_flops(lambda: model.encode(src))
        flops_all = counted_flops(lambda: beam_search(
            model, src, beam=spec.beam, max_len_a=0, max_len_b=steps - 1, min_len=steps - 1,
            early_stopping=True,
        ))  # fmt: skip
    finally:
        model.train(was_training)
    return {
        **out,
        "encoder_ms": lat.encoder_s * 1e3,
        "decoder_ms": lat.decoder_s * 1e3,
        "total_ms": lat.total_s * 1e3,
        "total_ms_samples": [t * 1e3 for t in lat.raw],
        "flops_encode": flops_encode,
        "flops_decoding": flops_all,
        "params": sum(p.numel() for p in model.parameters()),
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


def cell_main(
    argv: list[str], runners: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None
) -> int:
    """``python -m effiformer.bench --cell CELL.json --result RESULT.json``: run one cell and
    write its measurements (or ``{"error": ...}``) to RESULT.json. Exit 0 on success, 1 on error,
    130 (nothing written) when interrupted by SIGINT. ``runners``: the function for a cell of
    another ``kind`` (the quality suite's, given by ``effiformer.bench.__main__``)."""
    cell_path, result_path = _parse_cell_argv(argv)
    _die_with_parent()
    cell = json.loads(cell_path.read_text())
    run = (runners or {}).get(cell.get("kind", ""), run_cell)
    try:
        result: dict[str, Any] = run(cell)
        code = 0
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        return INTERRUPTED
    except Exception as e:  # reported to the parent as a skipped cell, never raised further
        traceback.print_exc(file=sys.stderr)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result = {"error": f"{type(e).__name__}: {msg}"[:500]}
        code = 1
    result_path.write_text(json.dumps(result))
    return code
