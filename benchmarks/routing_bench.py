"""One routing attention layer against causal dense SDPA and lucidrains' routing-transformer,
forward+backward, timed interleaved in one process (so the three see the same machine load) at
several lengths, plus each workload's peak memory above what is resident before its step (measured with glibc's
mmap threshold fixed, so that freed blocks go back to the system and the high-water mark is that
of live memory, not of the allocator's history).

The workloads are the ``effiformer bench --part attention`` ones (same builders): our
``routing-small`` first layer (as the model calls it: projections included; local blocks of
256), the bare ``sdpa`` reference row (no projections), and the
``routing-transformer`` reference row (:mod:`effiformer.bench.routing_references`, the ``bench``
extra; skipped when it is not installed). Writes one JSON line per (workload, length) with the
environment.

    PYTHONPATH=src python benchmarks/routing_bench.py --lengths 4096 8192 16384 --repeats 5 \
        --out benchmarks/results/routing_bench.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from effiformer import get_config
from effiformer.bench.cell import _reset_hwm, measure_peak_mib, model_workload
from effiformer.bench.references import CellSpec, list_references, missing_requirements
from effiformer.registry import create_model


def _git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip()
    except OSError:
        return "unknown"


def _workloads(name: str, overrides: dict, t: int, batch: int):
    import effiformer.bench.routing_references  # noqa: F401  (registers the reference row)

    config = get_config(name, seq_len=t, dropout=0.0, attn_dropout=0.0, **overrides)
    spec = CellSpec(
        name=name, config=config, part="attention", seq_len=t, batch=batch,
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = create_model(name, seq_len=t, dropout=0.0, attn_dropout=0.0, **overrides)
    out = {"effiformer": model_workload(model, spec)}
    for ref in list_references():
        if ref.name in ("sdpa", "routing-transformer") and ref.matches(name, config.family):
            if missing_requirements(ref):
                print(f"skipping {ref.name}: missing {missing_requirements(ref)}", file=sys.stderr)
                continue
            torch.manual_seed(0)
            out[ref.name] = ref.build(spec)
    return out


def _step(wl) -> None:
    wl.zero_grad()
    wl.step_loss(wl.forward()).backward()


MMAP_THRESHOLD = "131072"


def _peaks(wls: dict) -> dict[str, float]:
    out = {}
    for key, wl in wls.items():
        method = "clear_refs" if _reset_hwm() else "maxrss"
        out[key] = measure_peak_mib(lambda wl=wl: _step(wl), wl.zero_grad, method, _cpu())
    return out


def _live_peaks(argv: list[str], t: int) -> dict[str, float]:
    """The peaks measured in a child process whose glibc returns every freed block above
    128 KiB to the system (fixed ``MALLOC_MMAP_THRESHOLD_``): with the default dynamic threshold
    freed blocks of up to 32 MiB stay in the heap, so the high-water mark depends on the
    allocation history; with it fixed the mark is that of live memory. Timing is not done there
    (every large allocation is then a fresh mmap and its page faults)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--lengths", str(t), "--peaks-only"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="routing-small")
    p.add_argument("--set", dest="overrides", nargs="*", default=[])
    p.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192, 16384])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="JSON lines file (default: stdout only)")
    p.add_argument("--peaks-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from effiformer.config import parse_overrides

    overrides = parse_overrides(get_config(args.model), args.overrides)
    if args.peaks_only:
        wls = _workloads(args.model, overrides, args.lengths[0], args.batch)
        for wl in wls.values():
            _step(wl)
        print(json.dumps(_peaks(wls)))
        return 0
    base = [a for a in argv if a not in ("--peaks-only",)]
    child_argv = _without(base, "--lengths", "--out")
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "git_sha": _git_sha(),
        "device": "cpu",
    }
    records = []
    for t in args.lengths:
        live = _live_peaks(child_argv, t) if sys.platform == "linux" else {}
        wls = _workloads(args.model, overrides, t, args.batch)
        for wl in wls.values():  # warm-up (lucidrains initialises its centroids here)
            _step(wl)
        peaks = _peaks(wls)  # as `effiformer bench` measures it (default malloc)
        times: dict[str, list[float]] = {k: [] for k in wls}
        for _ in range(args.repeats):  # interleaved: every workload once per round
            for key, wl in wls.items():
                wl.zero_grad()
                t0 = time.perf_counter()
                wl.step_loss(wl.forward()).backward()
                times[key].append((time.perf_counter() - t0) * 1e3)
        for key in wls:
            rec = {
                "bench": "routing_layer_fwd_bwd",
                "model": args.model,
                "set": args.overrides,
                "workload": key,
                "seq_len": t,
                "batch": args.batch,
                "fwd_bwd_ms": statistics.median(times[key]),
                "fwd_bwd_ms_samples": times[key],
                "peak_mib_default_malloc": peaks[key],
                "peak_mib_live": live.get(key),
                **env,
            }
            for other in ("sdpa", "routing-transformer"):
                if other in times and other != key:
                    rec[f"speedup_vs_{other}"] = statistics.median(
                        [a / b for a, b in zip(times[other], times[key], strict=True)]
                    )
                    if live.get(other) and live.get(key):
                        rec[f"live_peak_ratio_vs_{other}"] = live[key] / live[other]
            records.append(rec)
            print(
                f"T={t:6d} {key:20s} {rec['fwd_bwd_ms']:9.1f} ms  peak {peaks[key]:7.1f} MiB "
                f"(live {live.get(key, float('nan')):7.1f})  "
                + "  ".join(
                    f"{k}={v:.2f}" for k, v in rec.items() if k.startswith(("speedup", "live_"))
                )
            )
        del wls
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    return 0


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv without the given flags and their values."""
    out, skip = [], False
    for a in argv:
        if a in flags:
            skip = True
            continue
        if skip and not a.startswith("--"):
            continue
        skip = False
        out.append(a)
    return out


def _cpu() -> torch.device:
    return torch.device("cpu")


if __name__ == "__main__":
    raise SystemExit(main())
