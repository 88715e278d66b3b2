"""The Reformer LM against the dense Transformer of the same size, same CPU time budget, on
tinyshakespeare (byte level, bits per character).

Rows (each trained for ``--time-budget`` seconds, or ``--steps`` steps for all alike):

- ``vanilla-small``: the dense pre-LN Transformer (d 256, 4 layers, 4 heads, ffn 1024, learned
  positions as in ``xl_vs_vanilla.py``);
- ``reformer-small``: the same size as a Reformer (reversible two-stream layers, shared-QK LSH
  attention with chunk 64 and 4 hashes, axial positions, ReLU FFN);
- ``vanilla-small+lsh``: the dense model with its attention swapped for the same LSH part, which
  separates what LSH costs from what the reversible two-stream body costs.

The public implementation's users report that LSH learns worse than full attention
(lucidrains/reformer-pytorch issue #69; the fastai RC2020 report): this measures by how much here.
Writes JSON lines (the environment first, then one record per model) to ``OUT/results.jsonl``.

    python benchmarks/reformer_lm_vs_dense.py --time-budget 1200          # the comparison
    python benchmarks/reformer_lm_vs_dense.py --time-budget 40            # smoke
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

from effiformer import create_model
from effiformer.bench import environment
from effiformer.config import parse_overrides
from effiformer.data import load_corpus
from effiformer.registry import get_config
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
CORPUS_NAME = "tinyshakespeare/input.txt"
CORPUS = (str(DATA / CORPUS_NAME), "text")
LSH = {"name": "lsh", "chunk_len": 64, "n_hashes": 4}
ROWS = {
    "vanilla-small": ("vanilla-small", {"positions": "learned"}),
    "reformer-small": ("reformer-small", {}),
    "vanilla-small+lsh": ("vanilla-small", {"positions": "learned", "attention": LSH}),
}


def run_one(args, corpus, label: str, out: Path) -> dict:
    name, extra = ROWS[label]
    over = {"vocab_size": corpus.vocab.size, "seq_len": args.seq_len, "dropout": args.dropout}
    over.update(extra)
    over.update(parse_overrides(get_config(name, **over), args.set))
    task = LMTask(
        corpus, batch_size=args.batch, seq_len=args.seq_len, seed=args.seed,
        eval_batch_size=args.eval_batch, eval_tokens=args.eval_tokens or None,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    model = create_model(name, **over)
    config = TrainConfig(
        steps=args.steps or None, lr=args.lr,  # a budget: train() sizes the schedule
        warmup=min(args.warmup, args.steps // 10) if args.steps else args.warmup,
        time_budget=None if args.steps else args.time_budget, eval_every=None, device="cpu",
        seed=args.seed, clip=1.0, progress=False, model_name=name,
    )  # fmt: skip
    t0 = time.monotonic()
    history = train(model, task, config)
    train_s = time.monotonic() - t0
    torch.manual_seed(args.seed)  # LSH draws rotations at evaluation too
    ev = task.evaluate(model, "valid")
    record = {
        "kind": "result",
        "benchmark": "reformer_lm_vs_dense",
        "model": label,
        "registered": name,
        "overrides": {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in over.items()},
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "schedule_steps": history.schedule_steps or history.step,
        "steps": history.step,
        "stop_reason": history.stop_reason,
        "train_seconds": train_s,
        "tokens_seen": history.step * args.batch * args.seq_len,
        "val_bpc": ev["bpc"],
        "val_tokens": ev["tokens"],
        "fingerprint": corpus.fingerprint,
        "loadavg_end": os.getloadavg(),
    }
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    logging.info("%s", json.dumps(record))
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--time-budget", type=float, default=600.0, help="seconds per model")
    p.add_argument("--steps", type=int, default=0, help="fixed steps for every model instead")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--eval-tokens", type=int, default=100_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", nargs="*", default=[], help="config overrides for every model")
    p.add_argument("--out", default="runs/reformer_lm_vs_dense")
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    corpus_path = _data.require(__file__, args.data, CORPUS_NAME) / CORPUS_NAME
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps({"kind": "environment", **env, "argv": argv or sys.argv[1:]}) + "\n")
    corpus = load_corpus(str(corpus_path), "text")
    rows = [run_one(args, corpus, m, out) for m in args.models]
    print(f"{'model':<20} {'params':>9} {'steps':>6} {'tokens':>10} {'val bpc':>8}")
    for r in rows:
        print(
            f"{r['model']:<20} {r['params']:>9,} {r['steps']:>6} {r['tokens_seen']:>10,} "
            f"{r['val_bpc']:>8.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
