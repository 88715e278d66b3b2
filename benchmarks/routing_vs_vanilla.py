"""Routing Transformer against the dense Transformer of the same size on tinyshakespeare.

``routing-small`` (vanilla-small's size: 4 layers, d 256, 4 heads, ffn 1024; 2 local heads with
blocks of ``--window`` plus 2 routing heads with ``round(sqrt(T))`` clusters, online k-means)
against ``vanilla-small`` (dense causal SDPA), same segment length ``T``, batch, optimiser,
schedule and CPU time budget (or, with ``--steps``, the same number of steps, which a loaded
shared machine cannot skew). Byte level, validation bits per character. The issue's target:
the routing model within 0.05 bpc of the dense one, or better.

Both models use learned absolute positions (the vanilla family's; the official Routing models
use relative ones). Writes JSON lines (environment first, one record per model) to
``OUT/results.jsonl`` and prints a table.

    python benchmarks/routing_vs_vanilla.py --time-budget 1200          # the comparison
    python benchmarks/routing_vs_vanilla.py --time-budget 60 --seq-len 256   # a smoke run
Reads ``tinyshakespeare/input.txt`` under the data folder: ``--data DIR``, else
``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (checked first: one line on
stderr and exit status 2 without it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from effiformer import create_model, get_config
from effiformer.bench import environment
from effiformer.config import parse_overrides
from effiformer.data import load_corpus
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
CORPUS_NAME = "tinyshakespeare/input.txt"
CORPUS = (str(DATA / CORPUS_NAME), "text")
MODELS = ("vanilla-small", "routing-small")


def _overrides(args: argparse.Namespace, name: str, vocab: int) -> dict:
    over = {"vocab_size": vocab, "seq_len": args.seq_len, "dropout": args.dropout}
    over.update(parse_overrides(get_config(name), args.set))
    if name.startswith("routing-"):
        over["attention.window"] = args.window
        if args.clusters:
            over["attention.clusters"] = args.clusters
    return over


def run_one(args: argparse.Namespace, corpus, name: str, out: Path) -> dict:
    over = _overrides(args, name, corpus.vocab.size)
    task = LMTask(
        corpus,
        batch_size=args.batch,
        seq_len=args.seq_len,
        seed=args.seed,
        eval_batch_size=args.eval_batch,
        eval_tokens=args.eval_tokens or None,
    )
    torch.manual_seed(args.seed)
    model = create_model(name, **over)
    config = TrainConfig(
        # a --time-budget run: train() times its first steps and sizes the schedule to the
        # steps that fit, warmup capped at a tenth of them
        steps=args.steps or None,
        lr=args.lr,
        warmup=min(args.warmup, args.steps // 10) if args.steps else args.warmup,
        time_budget=None if args.steps else args.time_budget,
        eval_every=None,
        device="cpu",
        seed=args.seed,
        clip=args.clip,
        model_name=name,
        progress=False,
    )
    t0 = time.monotonic()
    history = train(model, task, config)
    train_s = time.monotonic() - t0
    ev = task.evaluate(model, "valid", device="cpu")
    record = {
        "kind": "result",
        "benchmark": "routing_vs_vanilla",
        "corpus": "tinyshakespeare",
        "fingerprint": corpus.fingerprint,
        "model": name,
        "overrides": {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in over.items()},
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "lr": args.lr,
        "seq_len": args.seq_len,
        "schedule_steps": history.schedule_steps or history.step,
        "steps": history.step,
        "stop_reason": history.stop_reason,
        "train_seconds": train_s,
        "tokens_seen": history.step * args.batch * args.seq_len,
        "final_train_loss": history.train[-1]["loss"] if history.train else None,
        "val_bpc": ev["bpc"],
        "val_loss": ev["loss"],
        "val_tokens": ev["tokens"],
        "loadavg_end": os.getloadavg(),
    }
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    logging.info("%s", json.dumps(record))
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--time-budget", type=float, default=1200.0, help="seconds per model")
    p.add_argument("--steps", type=int, default=None, help="fixed steps instead of a budget")
    p.add_argument("--seq-len", type=int, default=512, help="segment length T (both models)")
    p.add_argument("--window", type=int, default=64, help="routing-small local block length")
    p.add_argument("--clusters", type=int, default=None, help="default: round(sqrt(T))")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.0, help="short runs see < 1 epoch")
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--eval-tokens", type=int, default=65536, help="validation tokens (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared box)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="both models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/out/routing_vs_vanilla")
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    corpus_path = _data.require(__file__, args.data, CORPUS_NAME) / CORPUS_NAME
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps({"kind": "environment", **env, "loadavg": os.getloadavg()}) + "\n")
    corpus = load_corpus(str(corpus_path), "text")
    rows = [run_one(args, corpus, name, out) for name in args.models]
    print(f"{'model':16s} {'steps':>6s} {'train s':>8s} {'val bpc':>8s}")
    for r in rows:
        print(f"{r['model']:16s} {r['steps']:6d} {r['train_seconds']:8.0f} {r['val_bpc']:8.4f}")
    if len(rows) == 2:
        print(f"routing - dense: {rows[1]['val_bpc'] - rows[0]['val_bpc']:+.4f} bpc")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
