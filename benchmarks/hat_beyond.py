"""Beyond HAT: the latency-dataset / predictor / search loop over a long-context family's own
hyper-parameters, on this CPU: a causal LM with local (sliding-chunk) attention
(``vanilla-small`` + ``attention=local``) on 1024-token segments.

1. a latency dataset of ``--n`` configurations (``attention.window``, ``n_heads``, ``ffn_dim``,
   ``n_layers``, ``dim``), each timed on one forward of a (1, 1024) segment (eval mode, inference
   mode, one thread, 2 warm-up and 10 timed runs, trimmed mean); resumable;
2. HAT's MLP predictor on it (8:1:1 split) against a linear fit on the hyper-parameters;
3. the search under each of ``--limits`` (HAT's evolution, smaller population), fitness either
   ``params`` (the most parameters under the limit) or ``train`` (validation loss on
   tinyshakespeare after ``--train-steps`` steps of each candidate at ``--train-seq-len``);
4. the chosen configurations measured for real (did they meet the limit?).

    python benchmarks/hat_beyond.py --n 150 --limits 120 250 --out runs/hat-beyond   # ~30 min idle
    python benchmarks/hat_beyond.py --n 150 --limits 120 250 --fitness train \\
        --train-steps 60 --out runs/hat-beyond-train                                 # ~2-3 h idle
    python benchmarks/hat_beyond.py --n 12 --runs 2 --warmup 0 --seq-len 256 --steps 200 \\
        --population 8 --iterations 2 --limits 1e6 --out /tmp/hat-beyond          # smoke

Writes ``OUT/family.csv`` (+ sidecar), ``OUT/predictor.pt``, ``OUT/results.jsonl``,
``OUT/predicted_vs_measured.png`` and ``OUT/search.png``.

``--fitness train`` reads ``tinyshakespeare/input.txt`` under the data folder: ``--data DIR``,
else ``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (checked first: one line
on stderr and exit status 2 without it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from effiformer import get_config
from effiformer.bench.harness import environment
from effiformer.config import parse_overrides
from effiformer.search.family import (
    FamilySettings,
    FamilySpace,
    build_family_dataset,
    measure_family,
    params_fitness,
    parse_choices,
    search_family,
    training_fitness,
)
from effiformer.search.plots import plot_frontier, plot_predicted_vs_measured
from effiformer.search.workflow import train_predictor_from_csv

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
CORPUS_NAME = "tinyshakespeare/input.txt"
CHOICES = [
    "attention.window=64,128,256,512",
    "n_heads=2,4,8",
    "ffn_dim=512,1024,2048",
    "n_layers=2,4,6",
    "dim=128,256",
]


def _write(f, rec: dict) -> None:
    f.write(json.dumps(rec, default=str) + "\n")
    f.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="vanilla-small")
    p.add_argument("--choices", nargs="+", default=CHOICES)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5000, help="predictor steps")
    p.add_argument("--lr", type=float, default=1e-4, help="predictor lr (HAT: 1e-5 for 2000 rows)")
    p.add_argument("--limits", nargs="+", type=float, required=True)
    p.add_argument("--fitness", choices=("params", "train"), default="params")
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--train-seq-len", type=int, default=256)
    p.add_argument("--population", type=int, default=24)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    if args.fitness == "train":  # the only data it reads
        corpus_path = _data.require(__file__, args.data, CORPUS_NAME) / CORPUS_NAME
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fixed = parse_overrides(get_config(args.model), ["attention=local", f"seq_len={args.seq_len}"])
    space = FamilySpace.create(args.model, parse_choices(args.model, args.choices, fixed), fixed)
    settings = FamilySettings(workload="forward", seq_len=args.seq_len, runs=args.runs,
                              warmup=args.warmup, threads=args.threads, seed=args.seed)  # fmt: skip
    results = open(out / "results.jsonl", "w")
    env = environment(torch.device("cpu"), "float32", args.threads, peak=False)
    _write(results, {"kind": "environment", **env, "loadavg": os.getloadavg(),
                     "argv": sys.argv[1:] if argv is None else argv})  # fmt: skip
    t0 = time.monotonic()
    data = build_family_dataset(out / "family.csv", space, args.n, settings)
    _write(results, {"kind": "dataset", "rows": len(data), "space": space.to_dict(),
                     "settings": settings.__dict__, "seconds": time.monotonic() - t0,
                     "latency_ms": [float(data.latency_ms.min()),
                                    float(data.latency_ms.max())]})  # fmt: skip
    report, record = train_predictor_from_csv(
        out / "family.csv", out / "predictor.pt", steps=args.steps, lr=args.lr, seed=args.seed
    )
    _write(results, {**record, "kind": "predictor"})
    plot_predicted_vs_measured(
        report.test_true, report.test_pred, out / "predicted_vs_measured.png",
        title=f"{args.model} + local attention, T={args.seq_len} (test split)",
        baselines={"linear on the hyper-parameters": report.baseline_pred["features_linear"]},
    )  # fmt: skip
    if args.fitness == "params":
        fitness = params_fitness(space)
        ylabel = "minus parameters (M)"
    else:
        from effiformer.data import load_corpus
        from effiformer.tasks import LMTask
        from effiformer.train import TrainConfig

        corpus = load_corpus(str(corpus_path), "text")

        def make_task(config):
            return LMTask(corpus, batch_size=8, seq_len=args.train_seq_len, eval_batch_size=8,
                          eval_tokens=20_000, seed=args.seed)  # fmt: skip

        cfg = TrainConfig(steps=args.train_steps, lr=1e-3, warmup=max(1, args.train_steps // 10),
                          eval_every=None, progress=False, device="cpu")  # fmt: skip
        fitness = training_fitness(space, make_task, cfg)
        ylabel = f"validation loss after {args.train_steps} steps"
    from effiformer.search.predictor import load_predictor

    predictor, _ = load_predictor(out / "predictor.pt")
    series, parents, third = [], args.population // 5, args.population * 2 // 5
    for limit in args.limits:
        t1 = time.monotonic()
        r = search_family(
            space, predictor, limit, fitness, population=args.population,
            parents=max(parents, 2), mutations=third,
            crossovers=args.population - max(parents, 2) - third,
            iterations=args.iterations, seed=args.seed,
        )  # fmt: skip
        ms, spread = measure_family(space, r.best, settings)
        rec = {"kind": "search", "limit_ms": limit, "best": r.best, "fitness": args.fitness,
               "best_fitness": r.best_fitness, "predicted_ms": r.best_latency,
               "measured_ms": ms, "measured_spread_ms": spread, "draws": r.draws,
               "candidates": len(r.evaluated), "seconds": time.monotonic() - t1}  # fmt: skip
        _write(results, rec)
        series.append({"label": f"candidates (limit {limit:g} ms)",
                       "x": [e.latency for e in r.evaluated],
                       "y": [e.fitness for e in r.evaluated], "alpha": 0.4})  # fmt: skip
        series.append({"label": f"best @ {limit:g} ms", "x": [r.best_latency],
                       "y": [r.best_fitness], "style": "*", "size": 160})  # fmt: skip
        print(f"limit {limit:g} ms: {r.best} predicted {r.best_latency:.1f} measured {ms:.1f} ms, "
              f"fitness {r.best_fitness:.4g}", flush=True)  # fmt: skip
    results.close()
    plot_frontier(series, out / "search.png", ylabel=ylabel, limits=args.limits,
                  title=f"{args.model} + local attention, T={args.seq_len}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
