"""Transformer-XL and Compressive Transformer against a dense Transformer of the same size.

Same CPU time budget, same segment length ``T``, same batch, same optimiser and schedule, on
tinyshakespeare (byte level, bits per character) and PTB (word level, perplexity). The dense
``vanilla-small`` sees at most its ``T``-token window (evaluated on non-overlapping windows, no
earlier context; learned absolute positions, its better setting in short runs); ``xl-small``
carries a memory of ``T`` states per layer, ``compressive-small`` a memory of ``T/2`` plus a
compressed memory of ``T/2`` slots at rate 4 (the same attention length as XL, a longer reach).
Widths can be shrunk for every model alike with ``--set``. After training, XL and Compressive are evaluated again with a
longer memory (``--eval-mem``, :func:`effiformer.models.transformer_xl.reconfigure`, same
weights), which should lower bpc / perplexity further; once as is and once with ``clamp_len`` at the
longest distance seen in training, the paper's evaluation recipe.

Writes JSON lines (environment first, one record per run) to ``OUT/results.jsonl`` and prints a
table. Every model gets ``--time-budget`` seconds of training per corpus, or, with ``--steps``,
the same number of steps (the same tokens), which a loaded shared machine cannot skew.

    python benchmarks/xl_vs_vanilla.py                                  # both corpora, 120 s/run
    python benchmarks/xl_vs_vanilla.py --corpora tinyshakespeare --time-budget 60
    python benchmarks/xl_vs_vanilla.py --set dim=128 n_heads=4 n_layers=2 ffn_dim=512

The corpora are read under the data folder (``tinyshakespeare/input.txt``, ``ptb/``): ``--data
DIR``, else ``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout; a missing one
stops the script before any training, with one line on stderr and exit status 2.
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

from effiformer import create_model, get_config, save_model
from effiformer.bench import environment
from effiformer.config import parse_overrides
from effiformer.data import load_corpus
from effiformer.models.transformer_xl import reconfigure
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

#: Each corpus: its path under the data folder, its format, and the files that must be there.
CORPUS_FILES = {
    "tinyshakespeare": ("tinyshakespeare/input.txt", "text", ["tinyshakespeare/input.txt"]),
    "ptb": ("ptb", "ptb", [f"ptb/ptb.{split}.txt" for split in ("train", "valid", "test")]),
}


def corpora(root: Path) -> dict[str, tuple[str, str]]:
    """``{name: (path, format)}`` of the corpora under the data folder ``root``."""
    return {name: (str(root / rel), fmt) for name, (rel, fmt, _) in CORPUS_FILES.items()}


# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
CORPORA = corpora(DATA)
MODELS = ("vanilla-small", "xl-small", "compressive-small")


def _environment(device: str = "cpu") -> dict:
    env = environment(torch.device(device), "float32", torch.get_num_threads(), peak=False)
    return {"kind": "environment", **env, "loadavg": os.getloadavg()}


def _overrides(name: str, vocab: int, seq_len: int, dropout: float, sets: list[str]) -> dict:
    over = {"vocab_size": vocab, "seq_len": seq_len, "dropout": dropout}
    over.update(parse_overrides(get_config(name), sets))
    if name.startswith("vanilla-"):
        # As benchmarks/train_tinyshakespeare.py: with fixed sinusoids added to 0.02-scale
        # embeddings the dense baseline sits on the unigram plateau for these short runs.
        over["positions"] = "learned"
    elif name.startswith("xl-"):
        over["mem_len"] = seq_len
    elif name.startswith("compressive-"):
        over.update(mem_len=seq_len // 2, cmem_len=seq_len // 2, compression_rate=4)
    return over


def _model_lr(args: argparse.Namespace, name: str) -> float:
    for item in args.model_lr:
        model, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--model-lr takes MODEL=LR items, got {item!r}")
        if model == name:
            return float(value)
    return args.lr


def run_one(args: argparse.Namespace, corpus_name: str, corpus, name: str, out: Path) -> dict:
    over = _overrides(name, corpus.vocab.size, args.seq_len, args.dropout, args.set)
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
        # a --time-budget run: train() times its first steps (on the device, under its
        # autocast) and sizes the schedule to the steps that fit, warmup capped at a tenth
        steps=args.steps or None,
        lr=_model_lr(args, name),
        warmup=min(args.warmup, args.steps // 10) if args.steps else args.warmup,
        time_budget=None if args.steps else args.time_budget,
        eval_every=None,
        device=args.device,
        seed=args.seed,
        clip=args.clip,
        out_dir=None,
        model_name=name,
        progress=False,
    )
    t0 = time.monotonic()
    history = train(model, task, config)
    train_s = time.monotonic() - t0
    t1 = time.monotonic()
    ev = task.evaluate(model, "valid", device=args.device)
    record = {
        "kind": "result",
        "benchmark": "xl_vs_vanilla",
        "corpus": corpus_name,
        "fingerprint": corpus.fingerprint,
        "model": name,
        "overrides": over,
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "lr": _model_lr(args, name),
        "seq_len": args.seq_len,
        "schedule_steps": history.schedule_steps or history.step,
        "steps": history.step,
        "stop_reason": history.stop_reason,
        "train_seconds": train_s,
        "tokens_seen": history.step * args.batch * args.seq_len,
        "metric": task.metric_name,
        "val": ev[task.metric_name],
        "val_loss": ev["loss"],
        "val_tokens": ev["tokens"],
        "eval_seconds": time.monotonic() - t1,
    }
    if not name.startswith("vanilla"):
        longer = {"mem_len": args.eval_mem}
        if name.startswith("compressive"):
            longer = {"mem_len": args.eval_mem // 2, "cmem_len": args.eval_mem // 2}
        ev_long = task.evaluate(reconfigure(model, **longer), "valid", device=args.device)
        record["eval_longer_memory"] = longer
        record["val_longer_memory"] = ev_long[task.metric_name]
        # The paper's evaluation recipe for a longer memory: distances beyond the longest one
        # seen in training share its encoding (clamp_len; e.g. enwik8 base: mem 2100, clamp 820).
        span = args.seq_len - 1 + over["mem_len"] + over.get("cmem_len", 0)
        clamped = {**longer, "clamp_len": span}
        ev_c = task.evaluate(reconfigure(model, **clamped), "valid", device=args.device)
        record["eval_longer_memory_clamped"] = clamped
        record["val_longer_memory_clamped"] = ev_c[task.metric_name]
    if args.save_models:
        path = save_model(model, out / "models" / f"{corpus_name}-{name}")
        record["saved"] = str(path)
    record["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    logging.info("%s", json.dumps(record))
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--time-budget", type=float, default=120.0, help="seconds per model per corpus")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="fixed number of steps for every model instead of the time budget (equal tokens; "
        "immune to a shared machine's load)",
    )
    p.add_argument("--seq-len", type=int, default=64, help="segment length T (all models)")
    p.add_argument("--eval-mem", type=int, default=256, help="longer evaluation memory")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument(
        "--model-lr",
        nargs="*",
        default=[],
        metavar="MODEL=LR",
        help="per-model learning rate overriding --lr, e.g. xl-small=1e-3 (each model at its own "
        "best rate from a sweep)",
    )
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--clip", type=float, default=0.25, help="grad-norm clip (XL scripts: 0.25)")
    p.add_argument("--dropout", type=float, default=0.0, help="short runs see < 1 epoch")
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--eval-tokens", type=int, default=32768, help="validation tokens (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared box)")
    p.add_argument(
        "--device", default="cpu", help="cpu (default; the CPU-budget comparison) or cuda"
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides applied to every model alike, e.g. dim=128 n_layers=2 ffn_dim=512",
    )
    p.add_argument(
        "--save-models",
        action="store_true",
        help="save each trained model under OUT/models/CORPUS-MODEL (re-evaluate it later)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/out/xl_vs_vanilla")
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    needed = [f for name in args.corpora for f in CORPUS_FILES[name][2]]
    paths = corpora(_data.require(__file__, args.data, *needed))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = _environment(args.device)
    env["command"] = " ".join([sys.executable, *sys.argv])
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(env) + "\n")
    rows = []
    for corpus_name in args.corpora:
        path, fmt = paths[corpus_name]
        corpus = load_corpus(path, fmt)
        for name in args.models:
            rows.append(run_one(args, corpus_name, corpus, name, out))
    budget = f"{args.steps} steps/run" if args.steps else f"{args.time_budget:.0f} s/run"
    print(f"\nT={args.seq_len}, batch {args.batch}, {budget}, "
          f"{args.threads} thread(s), overrides {args.set}, loadavg {env['loadavg']}")  # fmt: skip
    print(f"{'corpus':<16} {'model':<18} {'steps':>6} {'tokens':>9} {'metric':>6} "
          f"{'val':>8} {'val, eval mem ' + str(args.eval_mem):>20} {'+ clamp_len':>12}")  # fmt: skip
    for r in rows:
        cells = [r.get("val_longer_memory"), r.get("val_longer_memory_clamped")]
        longer_s, clamped_s = (f"{v:.3f}" if v is not None else "-" for v in cells)
        print(f"{r['corpus']:<16} {r['model']:<18} {r['steps']:>6} {r['tokens_seen']:>9} "
              f"{r['metric']:>6} {r['val']:>8.3f} {longer_s:>20} {clamped_s:>12}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
