"""Train ``vanilla-small`` on tinyshakespeare (byte level) for a fixed CPU time budget.

Reports validation bits per character (byte) on the whole validation split and training
tokens/s, and writes JSON lines with the environment to ``OUT/results.jsonl`` (the trainer's
per-step records go to ``OUT/metrics.jsonl``). The cosine schedule needs a length: unless
``--steps`` is given, a throwaway copy of the model is timed for a few steps first and the
schedule is sized to fill the budget. By default the model runs without dropout
(``--set dropout=0.0``; see ``DEFAULT_SET`` below).

    python benchmarks/train_tinyshakespeare.py                      # 600 s, the published figure
    python benchmarks/train_tinyshakespeare.py --time-budget 120    # a quick check
    python benchmarks/train_tinyshakespeare.py --data DIR           # DIR/tinyshakespeare/input.txt

The data folder: ``--data DIR``, else ``$EFFIFORMER_DATA``, else ``../shared/data`` beside the
checkout (``--data`` may also name ``input.txt`` itself); without the file the script stops at
once with one line on stderr and exit status 2.
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
DEFAULT_DATA = str(DATA / "tinyshakespeare" / "input.txt")
CORPUS_NAME = "tinyshakespeare/input.txt"
# Dropout is off: a 600 s CPU run sees at most a few epochs of the 1 MB text, far from
# overfitting, where dropout only slows learning. Pass --set dropout=0.1 for the registered
# config as is.
DEFAULT_SET = ["dropout=0.0"]


def _environment(device: str = "cpu") -> dict:
    env = environment(torch.device(device), "float32", torch.get_num_threads(), peak=False)
    return {"kind": "environment", **env, "loadavg": os.getloadavg()}


def _calibrate(args: argparse.Namespace, corpus) -> float:
    """Seconds per optimiser step of a throwaway model (3 warm-up steps, then the fastest of 5).

    The fastest, so that on a busy machine the schedule is rather too long (the time budget then
    stops the run before the cosine ends) than too short (the run would end early).
    """
    torch.manual_seed(args.seed)
    model = create_model(args.model, **args.overrides)
    task = LMTask(corpus, batch_size=args.batch, seq_len=args.seq_len, seed=args.seed)
    batches = task.train_batches(model, 0, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    times = []
    for i in range(8):
        t0 = time.perf_counter()
        batch = next(batches)
        out = task.forward(model, batch, None)
        out.total_loss.backward()
        opt.step()
        opt.zero_grad()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _data.add_data_flag(p, itself="tinyshakespeare's input.txt")
    p.add_argument("--model", default="vanilla-small")
    p.add_argument("--time-budget", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--steps", type=int, help="schedule length (default: calibrated to the budget)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-tokens", type=int, default=16384, help="tokens per periodic eval")
    p.add_argument(
        "--threads",
        default="auto",
        help="torch threads, or 'auto': time 1 and 2 threads and keep the faster (on a shared "
        "machine 1 thread is often several times faster than 2 contended ones)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help=f"config override of the registered model, repeatable (default: {DEFAULT_SET})",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/out/train_tinyshakespeare")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    # the data first: a missing file is one line, before any work
    args.data = str(
        _data.require_dataset(__file__, args.data, CORPUS_NAME, is_dataset=Path.is_file)
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists; remove it or pass another --out")
    corpus = load_corpus(args.data, "text")
    items = DEFAULT_SET if args.set is None else args.set
    overrides = parse_overrides(get_config(args.model), items)
    overrides["vocab_size"] = corpus.vocab.size
    args.overrides = overrides
    if args.threads == "auto":
        timed = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            timed[n] = _calibrate(args, corpus)
        threads = min(timed, key=timed.get)
        sec = timed[threads]
        print(f"threads: {timed} s/step -> {threads}", file=sys.stderr)
    else:
        threads = int(args.threads)
        sec = None
    torch.set_num_threads(threads)
    steps = args.steps
    if steps is None:
        sec = _calibrate(args, corpus) if sec is None else sec
        n_evals = args.time_budget / max(sec, 1e-3) / args.eval_every
        eval_overhead = 0.05 * args.time_budget if n_evals >= 1 else 0.0
        steps = max(args.warmup + 1, int((args.time_budget - eval_overhead) / sec))
        print(f"calibrated: {sec:.3f} s/step -> schedule of {steps} steps", file=sys.stderr)

    torch.manual_seed(args.seed)
    model = create_model(args.model, **overrides)
    task = LMTask(
        corpus,
        batch_size=args.batch,
        seq_len=args.seq_len,
        seed=args.seed,
        eval_tokens=args.eval_tokens,
    )
    config = TrainConfig(
        steps=steps,
        lr=args.lr,
        warmup=args.warmup,
        time_budget=args.time_budget,
        eval_every=args.eval_every,
        device="cpu",
        seed=args.seed,
        out_dir=str(out),
        model_name=args.model,
        progress=not args.no_progress,
    )
    env = _environment()
    t0 = time.monotonic()
    history = train(model, task, config)
    train_seconds = time.monotonic() - t0
    # Final score on the whole validation split (the periodic ones are capped).
    task.eval_tokens = None
    final = task.evaluate(model, "valid")
    tok_s = [r["tokens_per_s"] for r in history.train[10:]] or [0.0]
    result = {
        "kind": "result",
        "benchmark": "train_tinyshakespeare",
        "command": " ".join([sys.executable, *sys.argv]),
        "model": args.model,
        "params": sum(p.numel() for p in model.parameters()),
        "overrides": {
            k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in overrides.items()
        },
        "threads": threads,
        "corpus": corpus.name,
        "fingerprint": corpus.fingerprint,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "warmup": args.warmup,
        "schedule_steps": steps,
        "steps": history.step,
        "stop_reason": history.stop_reason,
        "train_seconds": train_seconds,
        "tokens_seen": history.step * args.batch * args.seq_len,
        "tokens_per_s_median": sorted(tok_s)[len(tok_s) // 2],
        "tokens_per_s_overall": history.step * args.batch * args.seq_len / train_seconds,
        "val_bpc": final["bpc"],
        "val_tokens": final["tokens"],
        "final_train_loss": history.train[-1]["loss"] if history.train else None,
        "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(env) + "\n")
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result))
    print(
        f"{args.model}: val bpc {final['bpc']:.3f} on {final['tokens']} tokens after "
        f"{history.step} steps ({result['tokens_seen']:,} tokens) in {train_seconds:.0f} s; "
        f"{result['tokens_per_s_median']:,.0f} tokens/s (median step)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
