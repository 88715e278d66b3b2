"""The Reformer paper's duplication task (Table 2): train with LSH-``k`` (default 1 hash), then
evaluate the same weights with 1, 2, 4 and 8 hashes; the paper finds accuracy rising with the
hashes used at evaluation (LSH-1 trained: 77.9 / 94.8 / 99.6 / 99.9 % with 1 / 2 / 4 / 8).

Model (paper, sec. 5; verify): one layer, d_model 256, 4 heads, shared-QK LSH attention, on
sequences ``0 w 0 w`` of 1024 tokens over 128 symbols; we use the ``vanilla`` family with the
``lsh`` attention part (``--chunk-len``, default 64) and train on the copied half
(:class:`effiformer.tasks.duplication.DuplicationTask`). ``--full`` trains a dense (full
attention) model instead, the table's first row (evaluated with full attention only).

Writes JSON lines (environment, the training record, one record per evaluated hash count) to
``OUT/results.jsonl`` and prints the row of the table.

    python benchmarks/reformer_duplication.py --time-budget 3600               # the experiment
    python benchmarks/reformer_duplication.py --seq-len 128 --time-budget 100  # smoke
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

from effiformer import create_model, save_model
from effiformer.bench import environment
from effiformer.tasks.duplication import DuplicationTask, evaluate_with_hashes
from effiformer.train import TrainConfig, train


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=1024, help="tokens of 0w0w (even)")
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--train-hashes", type=int, default=1)
    p.add_argument("--eval-hashes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--chunk-len", type=int, default=64)
    p.add_argument("--full", action="store_true", help="train dense attention instead")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--steps", type=int, default=150_000, help="schedule length (paper: 150K)")
    p.add_argument("--time-budget", type=float, default=None, help="stop after these seconds")
    p.add_argument("--eval-sequences", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="runs/reformer_duplication")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device(args.device), "float32", torch.get_num_threads(), peak=False)

    def write(rec: dict) -> None:
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    write({"kind": "environment", **env, "argv": argv or sys.argv[1:]})
    attention = (
        "dense"
        if args.full
        else {"name": "lsh", "chunk_len": args.chunk_len, "n_hashes": args.train_hashes}
    )
    torch.manual_seed(args.seed)
    model = create_model(
        "vanilla-small", dim=args.dim, n_heads=args.heads, n_layers=args.layers,
        ffn_dim=4 * args.dim, vocab_size=args.vocab, seq_len=args.seq_len, dropout=0.0,
        positions="learned", attention=attention,
    )  # fmt: skip
    task = DuplicationTask(
        seq_len=args.seq_len, vocab_size=args.vocab, batch_size=args.batch, seed=args.seed,
        eval_sequences=args.eval_sequences, eval_batch_size=min(16, args.eval_sequences),
    )  # fmt: skip
    config = TrainConfig(
        steps=args.steps, lr=args.lr, warmup=min(args.warmup, args.steps // 10),
        time_budget=args.time_budget, eval_every=None, device=args.device, seed=args.seed,
        clip=1.0, progress=False, out_dir=str(out / "run"),
    )  # fmt: skip
    t0 = time.monotonic()
    history = train(model, task, config)
    trained = "full" if args.full else f"lsh-{args.train_hashes}"
    write({
        "kind": "train", "benchmark": "reformer_duplication", "trained": trained,
        "steps": history.step, "stop_reason": history.stop_reason,
        "train_seconds": time.monotonic() - t0, "task": task.describe(),
        "config": model.config.to_dict(), "last_loss": history.train[-1]["loss"],
        "loadavg_end": os.getloadavg(),
    })  # fmt: skip
    save_model(model, out / f"model-{trained}")
    if args.full:
        results = {"full": task.evaluate(model, "test", device=args.device)}
    else:
        results = {
            f"lsh-{n}": r
            for n, r in evaluate_with_hashes(
                model, task, args.eval_hashes, split="test", device=args.device
            ).items()
        }
    for evaluated, r in results.items():
        write({"kind": "eval", "trained": trained, "evaluated": evaluated, **r})
    print(f"trained {trained} ({history.step} steps): " + "  ".join(
        f"{k} {100 * r['accuracy']:.1f}%" for k, r in results.items()
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
