"""Time per generated token of ``EffiModel.generate``: dense KV cache against recomputation.

``vanilla-small`` with its window raised to ``--seq-len`` (2,048 by default, so the cache never
has to be rebuilt below that) generates from a 1-token prompt. ``generate`` with the KV cache
feeds one token per step against the cached keys and values; a model without a cache would run
its forward over the whole context for every new token, whose cost at token ``n`` is one forward
over ``n`` tokens (timed directly at each point, median of ``--reps``: a loop of ever longer
recomputations would take hours). The cached figure at point ``n`` is the mean time per token
between the previous point and ``n``, from ``generate`` runs of each length (min of ``--reps``).
Weights are random: only time is measured.

    python benchmarks/generate_kv_cache.py --threads 1 --out benchmarks/results/generate_kv_cache.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from effiformer import create_model
from effiformer.bench import environment


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="vanilla-small")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--points", type=int, nargs="+", default=[100, 250, 500, 1000, 2000])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="JSON lines file (default: stdout only)")
    args = p.parse_args(argv)
    if max(args.points) > args.seq_len:
        p.error(f"--points must stay within --seq-len {args.seq_len}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create_model(args.model, seq_len=args.seq_len, dropout=0.0).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 1))
    records = [
        {
            "kind": "environment",
            **environment(torch.device("cpu"), "float32", args.threads, peak=False),
        }
    ]

    def timed_generate(n: int) -> float:
        best = float("inf")
        for _ in range(args.reps):
            g = torch.Generator().manual_seed(0)
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(prompt, n, top_k=40, generator=g)
            best = min(best, time.perf_counter() - t0)
        return best

    def recompute(n: int) -> float:
        x = torch.randint(0, model.config.vocab_size, (1, n))
        times = []
        with torch.no_grad():
            model(x)  # warm-up
            for _ in range(args.reps):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    timed_generate(8)  # warm-up
    prev_n, prev_t = 0, 0.0
    print("| tokens generated | KV cache, ms/token | recompute the context, ms/token |")
    print("|---|---|---|")
    for n in sorted(args.points):
        t = timed_generate(n)
        cached = (t - prev_t) / (n - prev_n) * 1e3
        full = recompute(n) * 1e3
        prev_n, prev_t = n, t
        rec = {
            "kind": "point",
            "model": args.model,
            "seq_len": args.seq_len,
            "tokens": n,
            "cached_ms_per_token": cached,
            "recompute_ms_per_token": full,
            "generate_total_s": t,
        }
        records.append(rec)
        print(f"| {n} | {cached:.1f} | {full:.1f} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
