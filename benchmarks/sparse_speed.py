"""Interleaved timing of the Sparse Transformer's attention layer against dense SDPA and
`local-attention`, in one process: robust ratios on a shared machine.

    python benchmarks/sparse_speed.py [--lengths 4096 16384] [--rounds 5] [--threads 2]
        [--out FILE.jsonl]

`effiformer bench` (benchmarks/sparse_bench.py) times each cell in its own process one after
the other, so on a machine shared with other jobs a change of load between two cells shows up as
a ratio. Here every workload (the same ones the harness builds: the first attention layer of the
`sparse-bench-*` configurations and of `vanilla-small`, the bare `sdpa` row, the
`local-attention` row) runs one forward+backward per round, in turn, for several rounds; each
round gives a ratio against the `sdpa` step of the same round, and the report is the median ratio
over rounds, with wall time and this process's CPU time (`time.process_time`, less sensitive to
other jobs than wall time). Peak memory comes from `effiformer bench`, not from here.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import sparse_plugin  # noqa: E402,F401  (registers the sparse-bench-* names and local-attention)
from effiformer.bench.cell import bench_overrides, model_workload  # noqa: E402
from effiformer.bench.references import CellSpec, list_references, missing_requirements  # noqa: E402
from effiformer.registry import create_model, get_config  # noqa: E402

MODELS = ["sparse-bench-strided-128", "sparse-bench-fixed-128", "sparse-bench-strided-256"]


def _spec(name: str, t: int) -> CellSpec:
    over = bench_overrides(name, [], t)
    return CellSpec(name, get_config(name, **over), "attention", t, 1, torch.device("cpu"),
                    torch.float32)  # fmt: skip


def _ref(name: str):
    return next(r for r in list_references() if r.name == name)


def workloads(t: int) -> dict:
    out = {}
    for name in [*MODELS, "vanilla-small"]:
        spec = _spec(name, t)
        out[name] = model_workload(create_model(name, **bench_overrides(name, [], t)), spec)
    out["sdpa"] = _ref("sdpa").build(_spec("vanilla-small", t))
    local = _ref("local-attention")
    if not missing_requirements(local):  # the `bench` extra
        out["local-attention-256"] = local.build(_spec("vanilla-small", t))
    return out


def step(wl) -> tuple[float, float]:
    wl.zero_grad()
    w0, c0 = time.perf_counter(), time.process_time()
    wl.step_loss(wl.forward()).backward()
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for t in args.lengths:
        wls = workloads(t)
        for wl in wls.values():  # warm-up
            step(wl)
        samples: dict[str, list[tuple[float, float]]] = {n: [] for n in wls}
        for _ in range(args.rounds):
            for name, wl in wls.items():
                samples[name].append(step(wl))
        base = samples["sdpa"]
        for name, s in samples.items():
            rec = {
                "name": name,
                "seq_len": t,
                "threads": args.threads,
                "rounds": args.rounds,
                "wall_ms_median": 1e3 * statistics.median(x[0] for x in s),
                "cpu_ms_median": 1e3 * statistics.median(x[1] for x in s),
                "speedup_vs_sdpa_wall": statistics.median(b[0] / x[0] for b, x in zip(base, s)),
                "speedup_vs_sdpa_cpu": statistics.median(b[1] / x[1] for b, x in zip(base, s)),
                "env": {"torch": torch.__version__, "python": platform.python_version()},
            }
            rows.append(rec)
            print(
                f"T={t:>6} {name:<26} wall {rec['wall_ms_median']:9.1f} ms  cpu "
                f"{rec['cpu_ms_median']:9.1f} ms  vs sdpa: wall {rec['speedup_vs_sdpa_wall']:5.2f}x"
                f"  cpu {rec['speedup_vs_sdpa_cpu']:5.2f}x",
                flush=True,
            )
        del wls
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
