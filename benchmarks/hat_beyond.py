"""Beyond HAT: the latency-dataset / predictor / search loop over a long-context family's own
hyper-parameters, on this CPU, and the chosen configuration's quality on the LM task.

Families (``--family``):

- ``sparse`` (default): the quality suite's Sparse Transformer LM (``vanilla-tiny`` at the
  budget's size, the ``sparse-strided`` row of ``--budget``) at T = 4,096, searched over the
  paper's own knobs (pattern strided/fixed, stride l, summary c, how the two patterns combine:
  merged, interleaved per layer, split between heads) with its width and depth;
- ``local``: ``vanilla-small`` + local attention at T = 1,024 (window, heads, widths, depth).

1. a latency dataset of ``--n`` configurations, each timed on one forward of a (1, T) segment
   (eval mode, inference mode, one thread, ``--warmup`` untimed and ``--runs`` timed runs,
   trimmed mean); resumable (``OUT/family.csv``);
2. HAT's MLP predictor on it (8:1:1 split) against a linear fit on the hyper-parameters;
3. the search under each of ``--limits``: a number (ms), or the name of a quality-suite row
   (``sparse-strided``, ``dense``, ...): that row's model, measured here the same way, sets the
   limit. HAT's evolution (population 125, 25 parents, 50 mutations, 50 crossovers,
   probability 0.3, 30 iterations by default); fitness ``params`` (the most parameters under the
   limit: no weight sharing, so no inherited accuracy to rank by) or ``train`` (validation loss
   after ``--train-steps`` steps of each candidate on tinyshakespeare at ``--train-seq-len``);
4. the chosen configurations measured for real (did they meet the limit?);
5. with ``--quality-from DIR`` (a quality run's ``--out`` at T, e.g. the long-context table),
   each chosen configuration trained on that run's task at equal compute with the row that set
   its limit (``sparse-strided`` for a numeric limit): both models' training steps timed here,
   the chosen one given ``steps(row) * step(row) / step(chosen)`` steps, the whole validation and
   test splits scored as the table's cells are; resumable.

Every record goes to ``OUT/results.jsonl`` as it is made; a rerun skips what is recorded.
``--pause PID ...`` stops those processes' process groups (training lanes) while this script
measures latency or times steps, and continues them after.

    python benchmarks/hat_beyond.py --family sparse --n 120 --runs 5 --warmup 1 \\
        --limits sparse-strided dense --quality-from benchmarks/results/long_context_cpu \\
        --out benchmarks/results/hat_beyond_sparse_cpu                       # ~1 h idle
    python benchmarks/hat_beyond.py --family local --n 150 --limits 120 250 \\
        --out runs/hat-beyond                                                # ~30 min idle
    python benchmarks/hat_beyond.py --family local --n 12 --runs 2 --warmup 0 --seq-len 256 \\
        --steps 200 --population 8 --iterations 2 --limits 1e6 --out /tmp/hat-beyond   # smoke

Writes ``OUT/family.csv`` (+ sidecar), ``OUT/predictor.pt``, ``OUT/results.jsonl``,
``OUT/table.md``, ``OUT/predicted_vs_measured.png`` and ``OUT/search.png``.

``--fitness train`` reads ``tinyshakespeare/input.txt`` and ``--quality-from`` its run's corpus
under the data folder: ``--data DIR``, else ``$EFFIFORMER_DATA``, else ``../shared/data`` beside
the checkout (checked first: one line on stderr and exit status 2 without it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from effiformer import get_config
from effiformer.bench.harness import environment
from effiformer.bench.quality import BUDGETS, LM_DATA
from effiformer.config import parse_overrides
from effiformer.search.evolution import InfeasibleLatencyError
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
from _quiet import paused  # noqa: E402  (benchmarks/_quiet.py: SIGSTOP the lanes while timing)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
CORPUS_NAME = "tinyshakespeare/input.txt"
LOCAL_CHOICES = [
    "attention.window=64,128,256,512",
    "n_heads=2,4,8",
    "ffn_dim=512,1024,2048",
    "n_layers=2,4,6",
    "dim=128,256",
]
SPARSE_CHOICES = [
    "attention.pattern=strided,fixed",
    "attention.stride=16,32,64,128,256",
    "attention.summary=4,8,16,32",
    "attention.combine=merged,interleaved,split",
    "n_layers=2,3,4,5,6",
    "dim=128,192,256,320",
    "n_heads=2,4,8",
    "ffn_dim=512,1024,2048",
]
#: the quality suite row whose model the sparse family starts from
SPARSE_ROW = "sparse-strided"


def _write(f, rec: dict) -> None:
    f.write(json.dumps(rec, default=str) + "\n")
    f.flush()


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _row_overrides(budget: str, task: str, row: str, seq_len: int) -> tuple[str, dict[str, Any]]:
    """(registered base, overrides) of a quality-suite row's LM at ``seq_len``, as its cells
    build it (byte vocabulary)."""
    from effiformer.bench.quality import _model_overrides

    model, over = _model_overrides(BUDGETS[budget], task, row, seq_len)
    return model, {**over, "seq_len": seq_len, "vocab_size": 256}


def _family(args) -> tuple[FamilySpace, str]:
    """The searched space and a title for the plots."""
    if args.family == "local":
        fixed = parse_overrides(
            get_config(args.model), ["attention=local", f"seq_len={args.seq_len}"]
        )
        choices = parse_choices(args.model, args.choices or LOCAL_CHOICES, fixed)
        return FamilySpace.create(args.model, choices, fixed), f"{args.model} + local attention"
    model, fixed = _row_overrides(args.budget, args.task, SPARSE_ROW, args.seq_len)
    # each value is parsed against the row's config: a summary of 1 there lets every searched
    # stride parse with the fixed pattern (combinations the config refuses are left out later)
    parse_base = {**fixed, "attention": {**fixed["attention"], "summary": 1}}
    choices = parse_choices(model, args.choices or SPARSE_CHOICES, parse_base)
    for key in choices:  # a searched plain key leaves the fixed ones; attention.* keys refine
        fixed.pop(key, None)
    title = "Sparse Transformer LM"
    return FamilySpace.create(model, choices, fixed), title


def _row_space(args, row: str) -> FamilySpace:
    """A one-point space: the quality suite's ``row`` model, measured like the candidates."""
    model, over = _row_overrides(args.budget, args.task, row, args.seq_len)
    dim = over.pop("dim")
    return FamilySpace.create(model, {"dim": (dim,)}, over)


def _limit_value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _quality(args, out: Path, results, done: dict, search: dict, space: FamilySpace) -> None:
    """Step 5: the chosen configuration trained at equal compute with its reference row."""
    from effiformer.bench.quality import (
        TIMING_STEPS,
        _make_cell,
        run_quality_cell,
        run_quality_timing,
    )

    src = Path(args.quality_from)
    manifest = json.loads((src / "quality.json").read_text())
    budget = BUDGETS[manifest["budget"]["name"]]
    row = search["limit"] if _limit_value(search["limit"]) is None else SPARSE_ROW
    refs = [r for r in _read(src / "results.jsonl")
            if r.get("task") == args.task and r.get("mechanism") == row
            and r.get("length") == args.seq_len and r.get("status") == "ok"]  # fmt: skip
    if not refs:
        raise SystemExit(f"{src}: no finished {args.task}/{row}/T{args.seq_len} cell to match")
    lr = float(refs[0]["lr"])
    data = str(_data.require(__file__, args.data, LM_DATA[args.task][0]))
    best = search["best"]
    base = _make_cell(budget, args.task, SPARSE_ROW, args.seq_len, lr, 0, 1, data=data, out=None)
    over = dict(space.fixed)
    over.update({k: v for k, v in best.items() if "." not in k})
    att = dict(over["attention"])
    att.update({k.split(".", 1)[1]: v for k, v in best.items() if k.startswith("attention.")})
    over["attention"] = att
    over.pop("vocab_size", None)  # the cell sets its corpus's
    chosen = {**base, "mechanism": f"searched@{search['limit']}", "overrides": over,
              "settings": att}  # fmt: skip
    ref_cell = _make_cell(budget, args.task, row, args.seq_len, lr, 0, 1, data=data, out=None)
    key = f"timing@{search['limit']}"
    if key not in done:
        timed = {}
        for name, cell in (("reference", ref_cell), ("chosen", chosen)):
            cell = {**cell, "steps": TIMING_STEPS}
            with paused(args.pause, group=True) as stopped:
                t = run_quality_timing(cell)
            timed[name] = {**t, "paused": stopped}
        done[key] = {"kind": "timing", "limit": search["limit"], "row": row, **timed}
        _write(results, done[key])
    timing = done[key]
    ref_steps = int(refs[0]["steps"])
    steps = max(1, math.floor(ref_steps * timing["reference"]["step_s"]
                              / timing["chosen"]["step_s"]))  # fmt: skip
    for seed in range(args.quality_seeds):
        qkey = f"quality@{search['limit']}/s{seed}"
        if qkey in done:
            continue
        cell = {**chosen, "seed": seed, "steps": steps, "eval_every": max(1, steps // 10),
                "cell": f"{args.task}/{chosen['mechanism']}/T{args.seq_len}/lr{lr:g}/s{seed}",
                "run_dir": str(out / "quality" / f"{search['limit']}_s{seed}")}  # fmt: skip
        t0 = time.monotonic()
        res = run_quality_cell(cell)
        ref_valid = [float(r["valid"]) for r in refs]
        ref_test = [float(r["test"]) for r in refs if r.get("test") is not None]
        rec = {"kind": "quality", "limit": search["limit"], "row": row, "seed": seed,
               "best": best, "steps": steps, "reference_steps": ref_steps,
               "step_s_here": timing["chosen"]["step_s"],
               "reference_step_s_here": timing["reference"]["step_s"],
               "reference_valid": ref_valid, "reference_test": ref_test,
               "seconds": time.monotonic() - t0, "cell": cell["cell"], **res}  # fmt: skip
        done[qkey] = rec
        _write(results, rec)
        print(f"{qkey}: {steps} steps, valid {res.get('valid')} (row {row}: {ref_valid})",
              flush=True)  # fmt: skip


def _table(out: Path, rows: list[dict[str, Any]]) -> None:
    refs = {r["row"]: r for r in rows if r.get("kind") == "reference"}
    lines = ["| limit | chosen configuration | params | predicted ms | measured ms |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r.get("kind") != "search":
            continue
        src = refs.get(r["limit"])
        lim = f"{r['limit_ms']:.0f} ms" + (f" ({r['limit']})" if src else "")
        cfg = ", ".join(f"{k.removeprefix('attention.')}={v}" for k, v in r["best"].items())
        lines.append(f"| {lim} | {cfg} | {-r['best_fitness']:.2f} M | {r['predicted_ms']:.0f} | "
                     f"{r['measured_ms']:.0f} ± {r['measured_spread_ms']:.0f} |")  # fmt: skip
    q = [r for r in rows if r.get("kind") == "quality"]
    if q:
        lines += ["", "| limit | model | steps (equal compute) | valid bpc | test bpc |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for lim in dict.fromkeys(r["limit"] for r in q):
            rs = [r for r in q if r["limit"] == lim]
            v = [float(r["valid"]) for r in rs]
            t = [float(r["test"]) for r in rs]

            def ms(xs):
                if len(xs) == 1:
                    return f"{xs[0]:.3f} (1)"
                half = (max(xs) - min(xs)) / 2  # the half-range, as the long-context table
                return f"{statistics.mean(xs):.3f} ± {half:.3f} ({len(xs)})"

            r0 = rs[0]
            lines.append(f"| {lim} | searched | {r0['steps']:,} | {ms(v)} | {ms(t)} |")
            lines.append(f"| {lim} | {r0['row']} (the table's row) | {r0['reference_steps']:,} | "
                         f"{ms(r0['reference_valid'])} | {ms(r0['reference_test'])} |")  # fmt: skip
    (out / "table.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", choices=("sparse", "local"), default="sparse")
    p.add_argument("--model", default="vanilla-small", help="the local family's model")
    p.add_argument("--budget", default="cpu-long", choices=sorted(BUDGETS),
                   help="the sparse family's quality budget")  # fmt: skip
    p.add_argument("--task", default="lm-ptb", choices=sorted(LM_DATA),
                   help="the sparse family's (and quality) LM task")  # fmt: skip
    p.add_argument("--choices", nargs="+", default=None, help="KEY=V1,V2 (default: the family's)")
    p.add_argument("--seq-len", type=int, default=None, help="default: 4096 sparse, 1024 local")
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5000, help="predictor steps")
    p.add_argument("--lr", type=float, default=1e-4, help="predictor lr (HAT: 1e-5 for 2000 rows)")
    p.add_argument(
        "--limits",
        nargs="+",
        required=True,
        help="ms, or a quality-suite row (sparse family) whose latency is the limit",
    )
    p.add_argument("--fitness", choices=("params", "train"), default="params")
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--train-seq-len", type=int, default=256)
    p.add_argument("--population", type=int, default=125)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pause",
        nargs="+",
        type=int,
        default=[],
        metavar="PID",
        help="process groups stopped (SIGSTOP) while this script measures or times",
    )
    p.add_argument(
        "--quality-from",
        default=None,
        metavar="DIR",
        help="a quality run at T: train each chosen configuration like its cells",
    )
    p.add_argument("--quality-seeds", type=int, default=1)
    p.add_argument(
        "--quality-limits",
        nargs="+",
        default=None,
        metavar="LIMIT",
        help="the limits whose chosen configuration is trained (default: all)",
    )
    p.add_argument("--out", required=True)
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    if args.seq_len is None:
        args.seq_len = 4096 if args.family == "sparse" else 1024
    if args.fitness == "train":  # the data it reads, checked before any work
        corpus_path = _data.require(__file__, args.data, CORPUS_NAME) / CORPUS_NAME
    rows_named = [x for x in args.limits if _limit_value(x) is None]
    if rows_named or args.quality_from:
        from effiformer.bench.mechanisms import MECHANISMS

        if args.family != "sparse":
            p.error("a limit named by a quality row, and --quality-from, need --family sparse")
        unknown = [x for x in rows_named if x not in MECHANISMS]
        if unknown:
            p.error(f"unknown limit(s) {unknown}: a number of ms or one of {sorted(MECHANISMS)}")
        if args.quality_from:
            if not (Path(args.quality_from) / "quality.json").is_file():
                p.error(f"--quality-from {args.quality_from}: no quality.json (not a quality run)")
            _data.require(__file__, args.data, LM_DATA[args.task][0])
        odd = set(args.quality_limits or ()) - set(args.limits)
        if odd:
            p.error(f"--quality-limits {sorted(odd)} are not among --limits {args.limits}")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    space, title = _family(args)
    title = f"{title}, T={args.seq_len}"
    settings = FamilySettings(workload="forward", seq_len=args.seq_len, runs=args.runs,
                              warmup=args.warmup, threads=args.threads, seed=args.seed)  # fmt: skip
    old = _read(out / "results.jsonl")
    done: dict[str, dict[str, Any]] = {}
    for r in old:
        k = r["kind"]
        if k in ("search", "reference"):
            done[f"{k}@{r['limit']}"] = r
        elif k in ("timing", "quality"):
            done[f"{k}@{r['limit']}" + (f"/s{r['seed']}" if k == "quality" else "")] = r
    results = open(out / "results.jsonl", "a")
    env = environment(torch.device("cpu"), "float32", args.threads, peak=False)
    _write(results, {"kind": "environment", **env, "loadavg": os.getloadavg(),
                     "argv": sys.argv[1:] if argv is None else argv})  # fmt: skip
    t0 = time.monotonic()
    with paused(args.pause, group=True) as stopped:
        data = build_family_dataset(out / "family.csv", space, args.n, settings)
    _write(results, {"kind": "dataset", "rows": len(data), "space": space.to_dict(),
                     "settings": settings.__dict__, "seconds": time.monotonic() - t0,
                     "paused": stopped,
                     "latency_ms": [float(data.latency_ms.min()),
                                    float(data.latency_ms.max())]})  # fmt: skip
    report, record = train_predictor_from_csv(
        out / "family.csv", out / "predictor.pt", steps=args.steps, lr=args.lr, seed=args.seed
    )  # seconds, and the same weights from the same rows and seed: retrained on a rerun
    if not any(r["kind"] == "predictor" and r.get("rows") == record.get("rows") for r in old):
        _write(results, {**record, "kind": "predictor"})
    plot_predicted_vs_measured(
        report.test_true, report.test_pred, out / "predicted_vs_measured.png",
        title=f"{title} (test split)",
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
    series, limits_ms = [], []
    parents = max(args.population // 5, 2)
    mutations = args.population * 2 // 5
    for limit in args.limits:
        limit_ms = _limit_value(limit)
        if limit_ms is None:  # a quality row's model, measured here like the candidates
            key = f"reference@{limit}"
            if key not in done:
                rs = _row_space(args, limit)
                with paused(args.pause, group=True) as stopped:
                    ms, spread = measure_family(rs, rs.sample(), settings)
                done[key] = {
                    "kind": "reference",
                    "limit": limit,
                    "row": limit,
                    "measured_ms": ms,
                    "measured_spread_ms": spread,
                    "paused": stopped,
                }
                _write(results, done[key])
            limit_ms = done[key]["measured_ms"]
        limits_ms.append(limit_ms)
        key = f"search@{limit}"
        if key not in done:
            t1 = time.monotonic()
            try:
                r = search_family(
                    space, predictor, limit_ms, fitness, population=args.population,
                    parents=parents, mutations=mutations,
                    crossovers=args.population - parents - mutations,
                    iterations=args.iterations, seed=args.seed,
                )  # fmt: skip
            except InfeasibleLatencyError as e:  # recorded, and the other limits still run
                print(f"limit {limit} ({limit_ms:.1f} ms): {e}", file=sys.stderr)
                _write(results, {"kind": "infeasible", "limit": limit, "limit_ms": limit_ms,
                                 "error": str(e)})  # fmt: skip
                continue
            with paused(args.pause, group=True) as stopped:
                ms, spread = measure_family(space, r.best, settings)
            done[key] = {"kind": "search", "limit": limit, "limit_ms": limit_ms, "best": r.best,
                         "fitness": args.fitness, "best_fitness": r.best_fitness,
                         "predicted_ms": r.best_latency, "measured_ms": ms,
                         "measured_spread_ms": spread, "paused": stopped, "draws": r.draws,
                         "candidates": len(r.evaluated), "seconds": time.monotonic() - t1,
                         "evaluated": [[e.latency, e.fitness] for e in r.evaluated]}  # fmt: skip
            _write(results, done[key])
        s = done[key]
        print(f"limit {limit} ({limit_ms:.1f} ms): {s['best']} predicted {s['predicted_ms']:.1f} "
              f"measured {s['measured_ms']:.1f} ms, fitness {s['best_fitness']:.4g}",
              flush=True)  # fmt: skip
        series.append({"label": f"candidates (limit {limit})",
                       "x": [e[0] for e in s["evaluated"]], "y": [e[1] for e in s["evaluated"]],
                       "alpha": 0.4})  # fmt: skip
        series.append({"label": f"best @ {limit}", "x": [s["predicted_ms"]],
                       "y": [s["best_fitness"]], "style": "*", "size": 160})  # fmt: skip
    plot_frontier(series, out / "search.png", ylabel=ylabel, limits=limits_ms, title=title)
    if args.quality_from:
        trained = args.limits if args.quality_limits is None else args.quality_limits
        for limit in (x for x in args.limits if f"search@{x}" in done and x in trained):
            _quality(args, out, results, done, done[f"search@{limit}"], space)
    results.close()
    _table(out, _read(out / "results.jsonl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
