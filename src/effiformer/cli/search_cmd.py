"""``effiformer search``: hardware-aware search (HAT) on this machine: ``latency-data`` measures a
latency dataset, ``predictor`` trains the latency predictor (with its baselines and a plot),
``evolve`` searches a trained SuperTransformer (or a family's hyper-parameters) under a latency
limit. Parsing and printing only: the work is :mod:`effiformer.search`'s."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import parse_overrides
from ..search.predictor import MIN_ROWS
from .common import (
    positive_float,
    positive_int,
    saved_model_dir,
    saved_model_lacks,
    setup_logging,
)

EPILOG = """examples:
  effiformer search latency-data --space multi30k --n 300 --out runs/hat/lat.csv
  effiformer search predictor runs/hat/lat.csv --out runs/hat/pred.pt --plot runs/hat/pred.png
  effiformer search predictor ../shared/data/hat-latency/wmt14ende_cpu_xeon_all.csv \\
      --hat-device xeon --out runs/hat/xeon.pt
  effiformer search evolve runs/hat/super --predictor runs/hat/pred.pt --latency-ms 40 \\
      --out runs/hat/evo40.json --plot runs/hat/evo40.png --export runs/hat/sub40
  # any registered family: a causal LM with local attention, one 1024-token segment
  effiformer search latency-data --model vanilla-small --set attention=local seq_len=1024 \\
      --choices attention.window=64,128,256 n_heads=2,4,8 ffn_dim=512,1024 --seq-len 1024 \\
      --n 100 --out runs/fam/lat.csv
  effiformer search predictor runs/fam/lat.csv --out runs/fam/pred.pt
  effiformer search evolve --family-data runs/fam/lat.csv --predictor runs/fam/pred.pt \\
      --latency-ms 150 --out runs/fam/evo.json"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help="latency datasets, the latency predictor, evolutionary search (HAT)",
        description="Hardware-aware search on this machine (HAT, Wang et al. 2020).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    steps = p.add_subparsers(dest="search_command", metavar="{latency-data,predictor,evolve}")

    d = steps.add_parser(
        "latency-data",
        help="measure a latency dataset on this machine (resumable)",
        description="Sample architectures, build each, time it; append rows to a CSV (resumable).",
    )
    d.add_argument("--out", required=True, help="the CSV (a sidecar OUT.jsonl is written beside)")
    d.add_argument("--n", type=_dataset_rows, default=300,
                   help=f"rows in all (default 300; at least {MIN_ROWS}, what the predictor "
                   "step splits 8:1:1)")  # fmt: skip
    d.add_argument(
        "--space", default="multi30k",
        help="HAT: the training space (wmt, iwslt, multi30k, tiny) whose wider latency space is "
        "sampled (default multi30k)",
    )  # fmt: skip
    d.add_argument("--training-space", action="store_true",
                   help="HAT: sample the training space itself, not the wider latency space")  # fmt: skip
    d.add_argument("--vocab-size", type=positive_int, default=8000, help="HAT output layer")
    d.add_argument("--src-len", type=positive_int, default=30,
                   help="HAT: source tokens and decoder steps (30 WMT, 23 IWSLT)")  # fmt: skip
    d.add_argument("--beam", type=positive_int, default=5, help="HAT beam (default 5)")
    d.add_argument("--model", help="family search: a registered model name")
    d.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="family: fixed config overrides (e.g. attention=local seq_len=1024)")  # fmt: skip
    d.add_argument("--choices", nargs="*", default=[], metavar="KEY=V1,V2",
                   help="family: the hyper-parameters to search and their values")  # fmt: skip
    d.add_argument("--workload", choices=("forward", "generate"), default="forward",
                   help="family: one segment's forward or per-token generation")  # fmt: skip
    d.add_argument("--seq-len", type=positive_int, default=1024,
                   help="family: segment (forward) or prompt (generate) length")  # fmt: skip
    d.add_argument("--new-tokens", type=positive_int, default=32, help="family: generate")
    d.add_argument("--warmup", type=int, default=None, help="untimed runs (HAT 5, family 2)")
    d.add_argument("--runs", type=positive_int, default=None, help="timed runs (HAT 20, family 10)")
    d.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    d.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    d.add_argument("--seed", type=int, default=0, help="of the samples (default 0)")
    d.add_argument("--no-resume", action="store_true", help="refuse an existing OUT")

    r = steps.add_parser(
        "predictor",
        help="train the latency predictor; compare it with linear baselines",
        description="HAT's MLP on a latency CSV, 8:1:1 split; test RMSE and MAPE with baselines.",
    )
    r.add_argument("data", help="a latency CSV (HAT's released files, or latency-data's)")
    r.add_argument("--out", help="save the predictor here")
    r.add_argument("--plot", help="predicted-vs-measured PNG of the test split")
    r.add_argument("--hat-device", choices=("xeon", "titanxp", "raspberrypi"),
                   help="HAT's official feature and latency norms for its released files")  # fmt: skip
    r.add_argument("--lat-norm", type=positive_float, help="latency scale (default: mean)")
    r.add_argument("--steps", type=positive_int, default=5000, help="default 5000 (HAT)")
    r.add_argument("--lr", type=positive_float, default=1e-5, help="default 1e-5 (HAT)")
    r.add_argument("--batch", type=positive_int, default=128, help="default 128 (HAT)")
    r.add_argument("--seed", type=int, default=0, help="split and initialisation (default 0)")

    e = steps.add_parser(
        "evolve",
        help="evolutionary search under a latency limit",
        description="Search a trained SuperTransformer (RUN) or a family (--family-data).",
    )
    e.add_argument("run", nargs="?", help="a SuperTransformer run directory or checkpoint")
    e.add_argument("--family-data", help="family search: its latency CSV (the space is in it)")
    e.add_argument("--predictor", required=True, help="the latency predictor (predictor --out)")
    e.add_argument("--latency-ms", type=positive_float, required=True, help="the limit")
    e.add_argument("--data", help="HAT: parallel data folder (default: the run's)")
    e.add_argument("--split", default="valid", help="HAT: fitness split (default valid)")
    e.add_argument("--sentences", type=positive_int, default=500,
                   help="HAT: validation pairs the fitness uses (default 500)")  # fmt: skip
    e.add_argument("--population", type=positive_int, default=125)
    e.add_argument("--parents", type=positive_int, default=25)
    e.add_argument("--mutations", type=int, default=50)
    e.add_argument("--crossovers", type=int, default=50)
    e.add_argument("--mutation-prob", type=float, default=0.3)
    e.add_argument("--iterations", type=positive_int, default=30)
    e.add_argument("--max-tries", type=positive_int, default=10_000,
                   help="draws of one candidate before the limit is called infeasible")  # fmt: skip
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="cpu")
    e.add_argument("--out", help="the result JSON")
    e.add_argument("--plot", help="loss-against-latency PNG of every candidate scored")
    e.add_argument("--export", help="HAT: save the best SubTransformer (inherited weights) here")


def _dataset_rows(text: str) -> int:
    """argparse ``type=`` of ``latency-data --n``: at least the rows ``predictor`` needs, said
    when the dataset is planned rather than after it was measured."""
    n = positive_int(text)
    if n < MIN_ROWS:
        raise argparse.ArgumentTypeError(
            f"the predictor step needs at least {MIN_ROWS} rows (it splits them 8:1:1), got {n}"
        )
    return n


def _latency_data(args: argparse.Namespace) -> dict:
    from ..models.hat import get_space, latency_space

    if args.model is not None:
        from ..registry import get_config
        from ..search.family import FamilySettings, FamilySpace, build_family_dataset, parse_choices

        if not args.choices:
            raise ValueError("a family dataset needs --choices KEY=V1,V2 ...")
        fixed = parse_overrides(get_config(args.model), args.set)
        space = FamilySpace.create(
            args.model, parse_choices(args.model, args.choices, fixed), fixed
        )
        settings = FamilySettings(
            workload=args.workload, seq_len=args.seq_len, new_tokens=args.new_tokens,
            warmup=2 if args.warmup is None else args.warmup, runs=args.runs or 10,
            threads=args.threads, device=args.device, seed=args.seed,
        )  # fmt: skip
        data = build_family_dataset(args.out, space, args.n, settings, resume=not args.no_resume)
        return {"out": args.out, "rows": len(data), "kind": "family", "model": args.model,
                "mean_ms": float(data.latency_ms.mean())}  # fmt: skip
    from ..search.latency import LatencySettings, build_latency_dataset

    space = get_space(args.space) if args.training_space else latency_space(args.space)
    settings = LatencySettings(
        vocab_size=args.vocab_size, src_len=args.src_len, beam=args.beam,
        warmup=5 if args.warmup is None else args.warmup, runs=args.runs or 20,
        threads=args.threads, device=args.device, seed=args.seed,
    )  # fmt: skip
    data = build_latency_dataset(args.out, space, args.n, settings, resume=not args.no_resume)
    return {"out": args.out, "rows": len(data), "kind": "hat", "space": args.space,
            "mean_ms": float(data.latency_ms.mean())}  # fmt: skip


def _predictor(args: argparse.Namespace) -> dict:
    from ..search.plots import plot_predicted_vs_measured
    from ..search.workflow import train_predictor_from_csv

    report, record = train_predictor_from_csv(
        args.data, args.out, hat_device=args.hat_device, lat_norm=args.lat_norm,
        steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
    )  # fmt: skip
    if args.plot:
        base = {
            k: v for k, v in (report.baseline_pred or {}).items() if not k.startswith("features")
        }
        record["plot"] = str(
            plot_predicted_vs_measured(
                report.test_true, report.test_pred, args.plot,
                title=f"{Path(args.data).name} (test split)", baselines=base,
            )
        )  # fmt: skip
    return record


def _evolve(args: argparse.Namespace) -> dict:
    from ..search import workflow

    evo = dict(
        population=args.population, parents=args.parents, mutations=args.mutations,
        crossovers=args.crossovers, mutation_prob=args.mutation_prob,
        iterations=args.iterations, seed=args.seed, max_tries=args.max_tries, progress=True,
    )  # fmt: skip
    if (args.run is None) == (args.family_data is None):
        raise ValueError("give a SuperTransformer RUN or --family-data CSV (one of them)")
    if args.family_data is not None:
        result, record = workflow.evolve_family(
            args.family_data, args.predictor, args.latency_ms, **evo
        )
        ylabel = "minus parameters (M)"
    else:
        saved = saved_model_dir(args.run)
        if saved is not None:
            raise saved_model_lacks(
                saved,
                "the tokenizer and data of its SuperTransformer run (tokenizer.json, meta.json) "
                "that evolve scores candidates with",
                "pass the run folder of effiformer train NAME --task translation --out RUN",
            )
        result, record = workflow.evolve_supernet_run(
            args.run, args.predictor, args.latency_ms, data=args.data, split=args.split,
            sentences=args.sentences, device=args.device, export=args.export, **evo,
        )  # fmt: skip
        ylabel = "validation loss (inherited weights)"
    if args.plot:
        from ..search.plots import plot_frontier

        pts = record["evaluated"]
        plot_frontier(
            [
                {"label": "candidates scored", "x": [p[0] for p in pts],
                 "y": [p[1] for p in pts], "alpha": 0.4},
                {"label": "best", "x": [result.best_latency], "y": [result.best_fitness],
                 "style": "*", "size": 160},
            ],
            args.plot, ylabel=ylabel, limits=[args.latency_ms],
        )  # fmt: skip
        record["plot"] = args.plot
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return {k: v for k, v in record.items() if k != "evaluated"}


def run(args: argparse.Namespace) -> int:
    setup_logging()
    commands = {"latency-data": _latency_data, "predictor": _predictor, "evolve": _evolve}
    if args.search_command is None:
        raise ValueError("choose a step: effiformer search {latency-data,predictor,evolve} ...")
    record = commands[args.search_command](args)
    print(json.dumps(record))
    line = _summary(args.search_command, record)
    if line:
        print(line)
    return 0


def _summary(step: str, record: dict) -> str | None:
    """A human line after the JSON record of ``predictor`` (test errors, best first)."""
    if step != "predictor" or not isinstance(record.get("test"), dict):
        return None
    errs = sorted(record["test"].items(), key=lambda kv: kv[1].get("rmse", float("inf")))
    parts = [f"{name} {e['rmse']:.2f} ms ({e['mape']:.1f}%)" for name, e in errs]
    where = f"; predictor saved to {record['predictor']}" if record.get("predictor") else ""
    return f"test RMSE (MAPE), best first: {', '.join(parts)}{where}"
