"""Time per generated token: Transformer-XL with memory against a dense Transformer.

``xl-small`` generates every token as a 1-token segment against its memory (``mem_len`` states
per layer), so its cost per token is set by ``mem_len`` and stays flat however many tokens have
been generated. ``vanilla-small`` has no cache here: every new token recomputes the forward pass
over its whole window, the last ``window`` tokens (``--window``, default 2048 = all the context
up to 2,000 tokens, so its cost grows with the context; and ``--short-window`` = ``mem_len`` for
the same attention length as XL). Weights are random: only time is measured.

XL runs a real generation loop of ``max(--points)`` tokens (per-token times recorded). For the
dense model the cost of token ``n`` depends only on ``min(n, window)``, so it is timed at each
point ``n`` directly (median of ``--reps`` forward passes over that context), which avoids a
2,000-step loop of ever longer recomputations.

Writes JSON lines (environment, then one record per point) to ``OUT/results.jsonl`` and prints
a table of milliseconds per token.

    python benchmarks/xl_generation.py
    python benchmarks/xl_generation.py --points 100 500 1000 2000 --mem-len 256 --threads 1
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

from effiformer import create_model
from effiformer.bench import environment


def xl_per_token_ms(model, n_tokens: int, seed: int) -> list[float]:
    """Generate ``n_tokens`` greedily one token at a time with memory; ms for each token."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, model.config.vocab_size, (1, 1), generator=g)
    state = model.init_state(1)
    times = []
    for _ in range(n_tokens):
        t0 = time.perf_counter()
        out = model(tok, state=state)
        state = out.state
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(1000 * (time.perf_counter() - t0))
    return times


@torch.no_grad()
def dense_token_ms(model, context: int, reps: int, seed: int) -> float:
    """ms to produce one token by recomputing the forward pass over ``context`` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=g)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        model(ids).logits[:, -1].argmax(-1)
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--points", type=int, nargs="+", default=[100, 250, 500, 1000, 2000])
    p.add_argument("--mem-len", type=int, default=256, help="XL memory per layer")
    p.add_argument("--window", type=int, default=2048, help="dense model's recomputed window")
    p.add_argument("--short-window", type=int, default=None, help="default: --mem-len")
    p.add_argument("--span", type=int, default=20, help="XL: average the last SPAN tokens")
    p.add_argument("--reps", type=int, default=3, help="dense: median of REPS forward passes")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/out/xl_generation")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    short = args.short_window or args.mem_len
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "kind": "environment",
        "command": " ".join([sys.executable, *sys.argv]),
        **environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False),
        "loadavg": os.getloadavg(),
    }
    torch.manual_seed(args.seed)
    xl = create_model("xl-small", mem_len=args.mem_len, dropout=0.0).eval()
    dense = create_model("vanilla-small", seq_len=max(args.window, short), dropout=0.0).eval()
    xl_ms = xl_per_token_ms(xl, max(args.points), args.seed)
    rows = []
    for n in sorted(args.points):
        lo = max(0, n - args.span)
        rec = {
            "kind": "result",
            "benchmark": "xl_generation",
            "tokens_generated": n,
            "xl_mem_len": args.mem_len,
            "xl_ms_per_token": statistics.mean(xl_ms[lo:n]),
            "dense_window": args.window,
            "dense_ms_per_token": dense_token_ms(dense, min(n, args.window), args.reps, args.seed),
            "dense_short_window": short,
            "dense_short_ms_per_token": dense_token_ms(dense, min(n, short), args.reps, args.seed),
        }
        rows.append(rec)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(env) + "\n")
        for rec in rows:
            f.write(json.dumps(rec) + "\n")
    print(f"{args.threads} thread(s), loadavg {env['loadavg']}; ms per generated token")
    print(f"{'tokens':>7} {'xl mem ' + str(args.mem_len):>12} {'dense win ' + str(short):>15} "
          f"{'dense win ' + str(args.window):>15}")  # fmt: skip
    for r in rows:
        print(f"{r['tokens_generated']:>7} {r['xl_ms_per_token']:>12.2f} "
              f"{r['dense_short_ms_per_token']:>15.2f} {r['dense_ms_per_token']:>15.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
