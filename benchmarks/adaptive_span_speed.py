"""Adaptive Attention Span: how much faster learned spans of about 0.1 S run than spans at S,
timed in one process with the two interleaved (A, B, A, B, ...), so that a shared machine's
changing load hits both alike; the ratio reported is the median of the per-round ratios.

The workloads are those of the ``effiformer bench`` rows ``span-0.1s`` / ``span-1.0s``
(:mod:`effiformer.bench.adaptive_span_references`): the registered model with ``--set``
applied, every head's p set by hand, the whole model against full per-layer memories or
layer 0's attention over its full memory, forward+backward (and forward alone under no_grad).

    python benchmarks/adaptive_span_speed.py                     # adaptive-span-base, 2 layers
    python benchmarks/adaptive_span_speed.py --set n_layers=1 --rounds 3 --threads 1

Writes JSON lines (environment, then one record per part) to ``OUT/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from effiformer import get_config
from effiformer.bench import environment
from effiformer.bench.adaptive_span_references import span_workload
from effiformer.bench.cell import count_flops
from effiformer.bench.references import CellSpec
from effiformer.config import parse_overrides
from effiformer.registry import get_spec


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name: str, sets: list[str], part: str, seq_len: int, fractions, rounds: int) -> dict:
    over = parse_overrides(get_spec(name).config, sets)
    over.setdefault("dropout", 0.0)
    over.setdefault("attn_dropout", 0.0)
    config = get_config(name, seq_len=seq_len, **over)
    spec = CellSpec(name, config, part, seq_len, 1, torch.device("cpu"), torch.float32)
    torch.manual_seed(0)
    wls = [span_workload(spec, p) for p in fractions]
    flops = [count_flops(wl) for wl in wls]  # doubles as the first warm-up

    def fwd_bwd(wl):
        wl.zero_grad()
        return _time(lambda: wl.step_loss(wl.forward()).backward())

    def fwd(wl):
        with torch.no_grad():
            return _time(wl.forward)

    for wl in wls:  # one more warm-up each
        fwd_bwd(wl)
    times = {"fwd_bwd": [[] for _ in wls], "fwd": [[] for _ in wls]}
    for _ in range(rounds):
        for i, wl in enumerate(wls):
            times["fwd_bwd"][i].append(fwd_bwd(wl))
            times["fwd"][i].append(fwd(wl))
    rec = {
        "kind": "result",
        "benchmark": "adaptive_span_speed",
        "name": name,
        "set": sets,
        "part": part,
        "seq_len": seq_len,
        "fractions": list(fractions),
        "rounds": rounds,
        "flops_fwd_bwd": [f[1] for f in flops],
        "flop_ratio": flops[-1][1] / flops[0][1],
        "windows": [
            [b.attn.window() for b in wl.module.blocks] for wl in wls
        ],  # per layer, per workload
    }
    for key, per in times.items():
        rec[f"{key}_s"] = per
        rec[f"{key}_median_s"] = [statistics.median(t) for t in per]
        ratios = [b / a for a, b in zip(per[0], per[-1])]
        rec[f"{key}_ratio_median"] = statistics.median(ratios)
        rec[f"{key}_ratio_min"] = min(ratios)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--name", default="adaptive-span-base")
    p.add_argument("--set", nargs="*", default=["n_layers=2"], metavar="KEY=VALUE")
    p.add_argument("--seq-len", type=int, default=512, help="segment length (base: 512)")
    p.add_argument("--fractions", nargs=2, type=float, default=[0.1, 1.0], metavar="P")
    p.add_argument("--parts", nargs="+", default=["attention", "model"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default="benchmarks/out/adaptive_span_speed")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    env = {"kind": "environment", **env, "loadavg": os.getloadavg()}
    env["command"] = " ".join([sys.executable, *sys.argv])
    recs = []
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(env) + "\n")
        for part in args.parts:
            rec = measure(args.name, args.set, part, args.seq_len, args.fractions, args.rounds)
            rec["loadavg_end"] = os.getloadavg()
            f.write(json.dumps(rec) + "\n")
            recs.append(rec)
    a, b = args.fractions
    print(f"{args.name} {' '.join(args.set)}, T={args.seq_len}, p = {a} vs {b}, "
          f"{args.rounds} interleaved rounds, {torch.get_num_threads()} thread(s), "
          f"loadavg {env['loadavg']}")  # fmt: skip
    print(f"{'part':<10} {'fwd+bwd s (p=' + str(a) + ')':>20} {'(p=' + str(b) + ')':>9} "
          f"{'speedup':>8} {'fwd':>6} {'FLOPs':>6}")  # fmt: skip
    for r in recs:
        ta, tb = r["fwd_bwd_median_s"]
        print(f"{r['part']:<10} {ta:>20.3f} {tb:>9.3f} {r['fwd_bwd_ratio_median']:>7.2f}x "
              f"{r['fwd_ratio_median']:>5.2f}x {r['flop_ratio']:>5.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
