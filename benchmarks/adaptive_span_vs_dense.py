"""Adaptive Attention Span against the dense Transformer of the same size, same CPU budget.

tinyshakespeare (byte level, bits per character), the protocol of ``xl_vs_vanilla.py``: same
segment length ``T``, batch, optimiser (AdamW), schedule, clipping and time budget (or, with
``--steps``, the same steps) for every model. Models (``--models``):

- ``vanilla-small``: the dense baseline (4 layers, d 256, 4 heads, FFN 1024, learned absolute
  positions), evaluated on non-overlapping ``T``-token windows.
- ``span-xl``: the paper's model (``adaptive-span-small``: post-LN, ReLU, unscaled untied
  embeddings, shared ``key_pe``, each layer caching its detached inputs, the cache sized to the
  span) at the dense model's size (4 layers), ``S = --max-span`` (1024), lambda ``--penalty``
  (the small model's 2e-6), R = 32, p initialised to 0; evaluated as a stream with its memory.
- ``span-vanilla``: the dense model with ``attention=adaptive_span`` (``S = T``: spans within
  the segment only, no memory), everything else as ``vanilla-small``.

The trainer has no Adagrad yet, so the paper's recipe (Adagrad lr 0.07, 32k warmup, per-parameter
clipping 0.03 inside the optimiser) is not used: every model gets the same AdamW recipe. The span
penalty is trained with and left out of the reported bpc (evaluation runs in eval mode).

Writes JSON lines (environment first, one record per run, with each adaptive-span model's
learned spans per layer and head) to ``OUT/results.jsonl``, a span plot per adaptive-span model
(``OUT/spans-MODEL.png``), and prints a table.

    python benchmarks/adaptive_span_vs_dense.py --time-budget 2400 --seq-len 128 --batch 32 \\
        --dropout 0.1 --lr 1e-3 --threads 1        # the comparison (one model per core: --models)
    python benchmarks/adaptive_span_vs_dense.py --time-budget 40 --eval-tokens 8192   # a smoke run

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

from effiformer import create_model, save_model
from effiformer.bench import environment
from effiformer.bench.spans import plot_span_report, span_report
from effiformer.config import parse_overrides
from effiformer.data import load_corpus
from effiformer.registry import family_config_class, get_spec
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
CORPUS_NAME = "tinyshakespeare/input.txt"
CORPUS = (str(DATA / CORPUS_NAME), "text")
MODELS = ("vanilla-small", "span-xl", "span-vanilla")
#: Each entry: the registered name it builds from.
BASE = {
    "vanilla-small": "vanilla-small",
    "span-xl": "adaptive-span-small",
    "span-vanilla": "vanilla-small",
}


def _overrides(args: argparse.Namespace, name: str, vocab: int) -> dict:
    t = args.seq_len
    over: dict = {"vocab_size": vocab, "seq_len": t, "dropout": args.dropout}
    if name == "vanilla-small":
        over["positions"] = "learned"
    elif name == "span-xl":
        over.update(
            n_layers=4,  # vanilla-small's depth (the registered small model has 8)
            mem_len=args.max_span,
            attn_dropout=args.dropout,
            attention={"max_span": args.max_span, "penalty": args.penalty},
        )
    elif name == "span-vanilla":
        over.update(
            positions="learned",
            attention={
                "name": "adaptive_span",
                "max_span": t,
                "penalty": args.penalty,  # lambda S mean(p) = lambda mean(z): per token of span
            },
        )
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    cls = family_config_class(get_spec(BASE[name]).family)
    over.update(parse_overrides(get_spec(BASE[name]).config, args.set))
    if "dim" in over and "embed_dim" in cls.field_names() and "embed_dim" not in over:
        over["embed_dim"] = over["dim"]  # XL's embed_dim is not re-derived from a new dim
    return over


def _span_summary(model: torch.nn.Module) -> dict | None:
    rows = span_report(model)
    if not rows:
        return None
    layers = sorted({r["layer"] for r in rows})
    per_layer = {}
    for layer in layers:
        spans = [r["span"] for r in rows if r["layer"] == layer]
        window = next(r["window"] for r in rows if r["layer"] == layer)
        per_layer[str(layer)] = {
            "mean": sum(spans) / len(spans),
            "max": max(spans),
            "window": window,
        }
    spans = [r["span"] for r in rows]
    return {
        "mean_span": sum(spans) / len(spans),
        "max_span_learned": max(spans),
        "max_span": rows[0]["max_span"],
        "per_layer": per_layer,
        "rows": rows,
    }


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
    model = create_model(BASE[name], **over)
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
        out_dir=None,
        model_name=BASE[name],
        progress=False,
    )
    t0 = time.monotonic()
    history = train(model, task, config)
    train_s = time.monotonic() - t0
    t1 = time.monotonic()
    ev = task.evaluate(model, "valid")
    record = {
        "kind": "result",
        "benchmark": "adaptive_span_vs_dense",
        "corpus": "tinyshakespeare",
        "fingerprint": corpus.fingerprint,
        "model": name,
        "base": BASE[name],
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
        "train_loss_last": history.train[-1]["loss"] if history.train else None,
        "metric": task.metric_name,
        "val": ev[task.metric_name],
        "val_loss": ev["loss"],
        "val_tokens": ev["tokens"],
        "eval_seconds": time.monotonic() - t1,
    }
    spans = _span_summary(model)
    if spans is not None:
        record["spans"] = spans
        plot_span_report(spans["rows"], os.fspath(out / f"spans-{name}.png"), title=name)
    if args.save_models:
        record["saved"] = str(save_model(model, out / "models" / name))
    record["loadavg_end"] = os.getloadavg()
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    logging.info("%s", json.dumps({k: v for k, v in record.items() if k != "spans"}))
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--time-budget", type=float, default=120.0, help="seconds per model")
    p.add_argument("--steps", type=int, default=None, help="equal steps instead of equal time")
    p.add_argument("--seq-len", type=int, default=128, help="segment length T (all models)")
    p.add_argument("--max-span", type=int, default=1024, help="S of span-xl (its mem_len too)")
    p.add_argument("--penalty", type=float, default=2e-6, help="lambda (adaptive-span-small)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--eval-tokens", type=int, default=32768, help="validation tokens (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared box)")
    p.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE",
        help="config overrides for every model alike, e.g. dim=128 n_heads=4 ffn_dim=512",
    )  # fmt: skip
    p.add_argument("--save-models", action="store_true", help="save under OUT/models/MODEL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/out/adaptive_span_vs_dense")
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    corpus_path = _data.require(__file__, args.data, CORPUS_NAME) / CORPUS_NAME
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    env = {"kind": "environment", **env, "loadavg": os.getloadavg()}
    env["command"] = " ".join([sys.executable, *sys.argv])
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(env) + "\n")
    corpus = load_corpus(str(corpus_path), "text")
    rows = [run_one(args, corpus, name, out) for name in args.models]
    budget = f"{args.steps} steps/run" if args.steps else f"{args.time_budget:.0f} s/run"
    print(f"\ntinyshakespeare, T={args.seq_len}, batch {args.batch}, {budget}, {args.threads} "
          f"thread(s), overrides {args.set}, loadavg {env['loadavg']}")  # fmt: skip
    print(f"{'model':<14} {'params':>9} {'steps':>6} {'tokens':>9} {'val bpc':>8} "
          f"{'mean span':>10} {'max span':>9}")  # fmt: skip
    for r in rows:
        s = r.get("spans")
        mean, top = (f"{s['mean_span']:.1f}", f"{s['max_span_learned']:.1f}") if s else ("-", "-")
        print(f"{r['model']:<14} {r['params']:>9,} {r['steps']:>6} {r['tokens_seen']:>9} "
              f"{r['val']:>8.3f} {mean:>10} {top:>9}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
