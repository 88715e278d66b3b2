"""HAT on Multi30k, end to end on this CPU: evolutionary search in a trained SuperTransformer under
latency limits, the chosen SubTransformers trained from scratch, compared with dense Transformers
of the same measured latency: test BLEU against measured latency (HAT fig. 5 / 6 on this data),
and the inherited-vs-from-scratch check.

Inputs: a SuperTransformer run (``benchmarks/hat_supernet_multi30k.py``) and a latency predictor
trained on this machine (``benchmarks/hat_latency_multi30k.py``). The work is a list of *jobs*
(models to train), planned first and then trained, in one call or in several:

1. plan (every call; what is recorded is not redone):
   - for each ``--limits`` value, HAT's search (evolution: population 125 = 25 + 50 + 50,
     mutation 0.3, ``--iterations`` 30; fitness = validation loss of the inherited SubTransformer
     on the first ``--fitness-sentences`` of ``val``; every candidate under the predicted limit),
     and the test BLEU of the inherited winner with ``--inherited-bleu`` (HAT table 5);
   - the dense baselines: ``--dense`` override sets of ``transformer-multi30k``, or ``auto``:
     for each limit the width/depth scaling of ``DENSE_GRID`` whose measured latency is the
     largest under it (the dense model of that latency);
   - with ``--anchors``, HAT's inherited-vs-from-scratch check: the largest and smallest
     SubTransformers, scored with inherited weights and trained from scratch;
   - every job's latency, measured as the dataset was (batch 1, 30 tokens, beam 5, ``--runs``);
   - with ``--equal-compute SECONDS``, every job's training step timed (``--timing-steps``, the
     first 4 left out, mean) one at a time, and its step budget = the whole steps that fit
     SECONDS of that time (``OUT/timing.json``): equal compute that a shared machine cannot
     bend, since the steps, not the wall clock, end each run. Without it, ``--train-budget``
     seconds of wall clock (or ``--train-steps``) end each run.
   Latencies and timings need a quiet machine: ``--pause PID ...`` stops those processes (e.g.
   a second training lane) with SIGSTOP while this call measures, and continues them after.
   ``OUT/plan.json`` lists the jobs; ``--plan-only`` stops here. ``--dense-only`` plans (and
   trains) the dense baselines alone, without the SuperTransformer's search: a lane that can
   start while the SuperTransformer still trains (a later call in the same folder reuses its
   measurements).
2. train (``--only NAME ...``: just those jobs, so that two one-thread lanes can share the
   jobs): each job from scratch with the translation task and ``effiformer.train.train``, the
   recipe of the SuperTransformer run (Adam (0.9, 0.98), lr 1e-3, inverse sqrt, warmup 1000
   steps capped to a quarter of the run, label smoothing 0.1, 4096-token batches), then test
   BLEU (sacreBLEU on ``test_2016_flickr``, beam 5, lenpen 1). ``--smallest-seeds K``: the jobs
   at the lowest limit (the two smallest models) are trained with seeds 0..K-1.
3. ``--remeasure K`` (with ``--no-train``: nothing trained by this call): every model's
   latency measured again, in K rounds of one model after another (a drift or a noisy neighbour touches all models alike); the report's latency is the
   median of every measurement of a model, with its range.
4. report: ``OUT/table.md``, ``OUT/bleu_vs_latency.png`` and ``OUT/search.png`` from every
   record so far.

Jobs are named ``hat-<limit>-s<seed>``, ``dense-<limit>-s<seed>`` (``dense-<i>-s<seed>`` for
explicit override sets) and ``anchor-largest-s0`` / ``anchor-smallest-s0``.

Resumable: rerun the same command with the same ``--out``; every search, measurement, timing and
model recorded in ``results.jsonl`` is skipped (a search reloads ``search_<limit>.json``; a model
interrupted mid-training resumes from its folder's checkpoint, written every 250 steps).

    python benchmarks/hat_search_multi30k.py --super runs/hat-super \\
        --predictor runs/hat-lat/predictor.pt --limits 60 90 --inherited-bleu --anchors \\
        --dense auto --equal-compute 1200 --smallest-seeds 2 --plan-only --out runs/hat-search
    python benchmarks/hat_search_multi30k.py ... --only hat-60-s0 hat-90-s0 hat-60-s1  # lane A
    python benchmarks/hat_search_multi30k.py ... --only dense-60-s0 dense-90-s0 ...     # lane B
    python benchmarks/hat_search_multi30k.py --super /tmp/hat-super \\
        --predictor /tmp/hat-lat/predictor.pt --limits 1e6 --iterations 1 --population 6 \\
        --parents 2 --mutations 2 --crossovers 2 --fitness-sentences 20 --train-steps 3 \\
        --test-sentences 10 --runs 2 --warmup 0 --dense decoder_layers=1 --out /tmp/hat-search

Writes ``OUT/results.jsonl`` (environment, searches, measurements, trained models with their BLEU
and measured latency), ``OUT/search_<limit>.json``, ``OUT/fitness.jsonl``, ``OUT/plan.json``,
``OUT/timing.json``,
``OUT/table.md``, ``OUT/bleu_vs_latency.png``, ``OUT/search.png`` (every candidate each
search scored: predicted latency against inherited validation loss) and ``OUT/loss_vs_time.png``
(each model's training loss against the quiet compute it had spent).

The parallel text is read from ``multi30k/`` under the data folder: ``--data DIR``, else
``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (``--data`` may also name the
Multi30k folder itself, as before); without it the script stops at once with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from effiformer import create_model
from effiformer.bench.decoding import decoding_latency
from effiformer.bench.harness import environment
from effiformer.bench.quality import NoEval, allocate_steps
from effiformer.checkpoint import LATEST
from effiformer.config import parse_overrides
from effiformer.data import ParallelData
from effiformer.models.hat import SuperTransformer
from effiformer.models.hat_space import SubTransformer
from effiformer.search.hat import (
    load_supernet_run,
    result_record,
    search_subtransformer,
    validation_batches,
    validation_loss,
)
from effiformer.search.latency import LatencySettings, measure_subtransformer
from effiformer.search.plots import plot_frontier
from effiformer.search.predictor import load_predictor
from effiformer.tasks.supernet import representative_subtransformers
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)
from _quiet import paused  # noqa: E402  (benchmarks/_quiet.py: SIGSTOP the lanes while timing)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
DENSE = ["decoder_layers=1", "decoder_layers=2", "n_layers=2 decoder_layers=2 dim=192 n_heads=4"]


def _write(f, rec: dict) -> None:
    f.write(json.dumps(rec) + "\n")
    f.flush()


def _warmup_for(steps: int) -> int:
    """The recipe's warmup: 1000 steps (HAT's), capped to a quarter of a shorter run."""
    return max(1, min(1000, steps // 4))


def _config(args, steps: int, seed: int, out_dir: Path | None, time_budget: float | None):
    resume = out_dir is not None and (out_dir / LATEST).is_file()
    return TrainConfig(
        steps=steps, optimizer="adam", lr=1e-3, betas=(0.9, 0.98), eps=1e-8,
        weight_decay=0.0, warmup=_warmup_for(steps), schedule="inverse_sqrt", clip=None,
        seed=seed, device="cpu", time_budget=time_budget, eval_every=None,
        out_dir=None if out_dir is None else str(out_dir),
        log_every=1 if out_dir is None else max(1, min(25, steps // 10)),  # short runs: often
        progress=not args.quiet and out_dir is not None,
        checkpoint_every=None if out_dir is None else 250,
        resume=str(out_dir) if resume else None,
    )  # fmt: skip


def _train(model, task: TranslationTask, args, out_dir: Path, steps: int | None, seed: int) -> dict:
    """Train from scratch for ``steps`` (equal compute) or, without, ``--train-budget`` seconds
    of wall clock capped at ``--train-steps``; an interrupted run resumes from its folder's
    checkpoint (a step budget continues; a time budget restarts its clock)."""
    if steps is not None:
        cfg = _config(args, steps, seed, out_dir, None)
    else:
        cfg = _config(args, args.train_steps, seed, out_dir, args.train_budget)
    t0 = time.monotonic()
    history = train(model, task, cfg)
    return {"steps": history.step, "train_s": time.monotonic() - t0, "warmup": cfg.warmup,
            "last_loss": history.losses[-1] if history.losses else None}  # fmt: skip


#: training steps a timing runs, and how many of its first it leaves out
TIMING_SKIP = 4


def _time_steps(model, task: TranslationTask, args) -> dict:
    """Seconds per training step of ``model`` (the recipe, this process's threads): the mean of
    ``--timing-steps`` steps after the first ``TIMING_SKIP`` (a mean, not a median: batches
    differ in length, and the budget is a sum of steps)."""
    cfg = _config(args, args.timing_steps + TIMING_SKIP, args.seed, None, None)
    history = train(model, NoEval(task), cfg)
    times = [r["step_s"] for r in history.train if "step_s" in r][TIMING_SKIP:]
    return {"step_s": statistics.fmean(times), "steps_timed": len(times),
            "spread_s": statistics.pstdev(times), "loadavg": list(os.getloadavg()),
            "threads": torch.get_num_threads()}  # fmt: skip


#: Width and depth scalings of transformer-multi30k that ``--dense auto`` measures.
DENSE_GRID = [
    f"n_layers={n} decoder_layers={m} dim={d} n_heads={d // 64} ffn_dim={4 * d}"
    for d in (128, 192, 256) for n in (1, 2, 3) for m in (1, 2, 3)
]  # fmt: skip


def _dense_model(spec: str, vocab: int):
    over = parse_overrides(create_model("transformer-multi30k").config, spec.split())
    return create_model("transformer-multi30k", vocab_size=vocab, **over)


def _dense_latency(spec: str, vocab: int, args) -> float:
    model = _dense_model(spec, vocab).eval()
    lat = decoding_latency(model, src_len=30, beam=5, runs=args.runs, warmup=args.warmup,
                           threads=args.threads)  # fmt: skip
    return lat.total_s * 1e3


def _dense_for_limits(limits, vocab: int, args, results, measured=None) -> list[str | None]:
    """For each latency limit, the DENSE_GRID scaling whose measured latency (batch 1, beam 5,
    the dataset's setting) is the largest under it: the dense model of that latency (None where
    no scaling is under the limit). ``measured``: a grid measured before ([[ms, spec], ...])."""
    if measured is None:
        measured = [(_dense_latency(spec, vocab, args), spec) for spec in DENSE_GRID]
        _write(results, {"kind": "dense_grid", "measured": [[ms, spec] for ms, spec in measured]})
    picked = []
    for limit in limits:
        under = [(ms, spec) for ms, spec in measured if ms <= limit]
        picked.append(max(under)[1] if under else None)
    return picked


def _test(model, task: TranslationTask, args) -> dict:
    task.eval_sentences = args.test_sentences
    try:
        r = task.evaluate(model, args.test_split, beam=args.beam)
    finally:
        task.eval_sentences = args.eval_sentences
    return {"bleu": r["bleu"], "chrf": r["chrf"], "test_loss": r["loss"],
            "sentences": r["sentences"], "bleu_signature": r["bleu_signature"]}  # fmt: skip


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {(max(values) - min(values)) / 2:.2f}"


def _md(text: str) -> str:
    """Text for a markdown table cell (a SubTransformer's description holds ``|``)."""
    return text.replace("|", "\\|")


def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def report(out: Path, test_split: str = "test_2016_flickr", beam: int = 5) -> str:
    """``OUT/table.md`` and ``OUT/bleu_vs_latency.png`` from the records in ``OUT``; returns
    the table's markdown."""
    rows = _read(out / "results.jsonl")
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    jobs = {j["name"]: j for j in plan.get("jobs", [])}
    trained = [r for r in rows if r.get("kind") == "trained"]
    groups: dict[str, list[dict]] = {}
    for r in trained:
        groups.setdefault(r["group"], []).append(r)
    searches = {r["limit_ms"]: r for r in rows if r.get("kind") == "search"}
    # every latency measured for a model (at planning, and --remeasure's interleaved rounds):
    # the median is its latency, the range its spread
    measured: dict[str, list[float]] = {}
    for r in rows:
        if r.get("kind") in ("latency", "remeasure"):
            measured.setdefault(r["group"], []).append(r["measured_ms"])

    def latency(r: dict) -> float:
        return statistics.median(measured.get(r["group"]) or [r["measured_ms"]])

    def latency_cell(r: dict) -> str:
        ms = measured.get(r["group"]) or [r["measured_ms"]]
        if len(ms) == 1:
            return f"{ms[0]:.1f}"
        return f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}, {len(ms)})"

    lines = [
        f"Test BLEU (sacreBLEU, {test_split}, beam {beam}) of every model trained from scratch, "
        "against its latency measured on this CPU (batch 1, 30 tokens, beam 5; with several "
        "measurements: the median (range, count)). `± x`: half the range over seeds. Steps: the steps each got (equal compute: the quiet seconds per step "
        "times the steps is the same budget for every model).",
        "",
        "| model | limit (ms) | architecture | params (M) | measured (ms) | predicted (ms) | "
        "steps | s/step (quiet) | seeds | test BLEU | inherited BLEU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"hat": 0, "dense": 1, "anchor": 2}
    for _, rs in sorted(groups.items(), key=lambda kv: (order.get(kv[1][0]["model"], 3),
                                                        kv[1][0].get("limit_ms") or 0, kv[0])):  # fmt: skip
        r = rs[0]
        inherited = None
        if r["model"] != "dense":  # a SubTransformer: its inherited weights were scored too
            inherited = r.get("inherited") or (searches.get(r.get("limit_ms")) or {}).get(
                "inherited"
            )
        cells = [
            r["model"], r.get("limit_ms") or "-", _md(r["description"]), f"{r['params'] / 1e6:.2f}",
            latency_cell(r), _num(r.get("predicted_ms"), 1),
            "/".join(str(x["steps"]) for x in rs), _num(r.get("step_s"), 3), len(rs),
            _spread([x["bleu"] for x in rs]), _num((inherited or {}).get("bleu"), 2),
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    # every SubTransformer scored with the SuperTransformer's weights (trained or not)
    inherited_rows, seen = [], set()
    for j in jobs.values():
        if j.get("inherited") and j["group"] not in seen:
            seen.add(j["group"])
            inherited_rows.append(
                f"| {j['group']} | {_md(j['description'])} | {latency_cell(j)} | "
                f"{j['inherited']['bleu']:.2f} |"
            )
    if inherited_rows:
        lines += ["", "SubTransformers with inherited weights (no training of their own; the "
                  "SuperTransformer's), the same test set and beam:", "",
                  "| SubTransformer | architecture | measured (ms) | inherited test BLEU |",
                  "|---|---|---|---|", *inherited_rows]  # fmt: skip
    missing = [n for n in jobs if not any(r["name"] == n for r in trained)]
    if missing:
        lines += ["", f"Not trained yet: {', '.join(missing)}."]
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)

    def points(model: str, key: str = "bleu"):
        xs, ys = [], []
        for rs in groups.values():
            if rs[0]["model"] == model:
                xs.append(latency(rs[0]))
                ys.append(statistics.fmean(x[key] for x in rs))
        return xs, ys

    series = []
    for model, label, style, size in (
        ("hat", "HAT SubTransformer (from scratch)", "-*", 12),
        ("dense", "dense Transformer, scaled (from scratch)", "-o", 6),
        ("anchor", "largest / smallest SubTransformer (from scratch)", "x", 40),
    ):
        x, y = points(model)
        if x:
            series.append({"label": label, "x": x, "y": y, "style": style, "size": size})
    # every SubTransformer scored with inherited weights (the winners and the anchors)
    inh, seen = [], set()
    for j in jobs.values():
        if j.get("inherited") and j["group"] not in seen:
            seen.add(j["group"])
            inh.append((latency(j), j["inherited"]["bleu"]))
    if inh:
        series.append({"label": "SubTransformers, inherited weights", "x": [x for x, _ in inh],
                       "y": [y for _, y in inh], "style": "+", "size": 60})  # fmt: skip
    if series:
        plot_frontier(series, out / "bleu_vs_latency.png",
                      xlabel="measured latency on this CPU (ms, batch 1, beam 5)",
                      ylabel=f"test BLEU ({test_split}, beam {beam})",
                      title="Multi30k En->De: HAT vs scaled dense Transformers",
                      limits=plan.get("limits", []))  # fmt: skip
    curves = []  # training loss against the quiet compute spent: who learns faster per second
    for r in sorted(trained, key=lambda r: r["name"]):
        log = _read(out / r["name"] / "metrics.jsonl")
        pts = [(x["step"], x["loss"]) for x in log if "loss" in x and "step" in x]
        if pts and r.get("step_s"):
            k = 4  # a moving average over 4 logged points (100 steps)
            ys = [statistics.fmean(y for _, y in pts[max(0, i - k + 1) : i + 1])
                  for i in range(len(pts))]  # fmt: skip
            curves.append({"label": f"{r['name']} ({r['model']})", "style": "-",
                           "x": [st * r["step_s"] / 60 for st, _ in pts], "y": ys})  # fmt: skip
    if curves:
        plot_frontier(curves, out / "loss_vs_time.png",
                      xlabel="quiet compute spent (minutes: steps x quiet s/step)",
                      ylabel="training loss (label-smoothed, moving average)",
                      title="Multi30k En->De from scratch, equal compute")  # fmt: skip
    clouds = []
    for limit in plan.get("limits", []):
        path = out / f"search_{limit:g}.json"
        if path.is_file():
            rec = json.loads(path.read_text())
            ev = rec.get("evaluated") or []
            clouds.append({"label": f"candidates, limit {limit:g} ms", "x": [e[0] for e in ev],
                           "y": [e[1] for e in ev], "style": "o", "size": 6, "alpha": 0.4})  # fmt: skip
            clouds.append({"label": f"chosen, limit {limit:g} ms",
                           "x": [rec["best_predicted_ms"]], "y": [rec["best_fitness"]],
                           "style": "*", "size": 160})  # fmt: skip
    if clouds:
        plot_frontier(clouds, out / "search.png", limits=plan.get("limits", []),
                      title="HAT's evolution on this CPU's predictor")  # fmt: skip
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--super", required=True, help="SuperTransformer run directory")
    p.add_argument("--predictor", required=True)
    p.add_argument("--limits", nargs="+", type=float, required=True, help="ms")
    _data.add_data_flag(p, itself="the Multi30k folder")
    p.add_argument("--population", type=int, default=125)
    p.add_argument("--parents", type=int, default=25)
    p.add_argument("--mutations", type=int, default=50)
    p.add_argument("--crossovers", type=int, default=50)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--fitness-sentences", type=int, default=500)
    p.add_argument("--inherited-bleu", action="store_true")
    p.add_argument(
        "--anchors", action="store_true",
        help="also the inherited-vs-from-scratch check: the largest and smallest SubTransformers "
        "(HAT's validation pair) scored with inherited weights and trained from scratch",
    )  # fmt: skip
    p.add_argument("--dense", nargs="*", default=DENSE,
                   help="override sets of transformer-multi30k (space-separated KEY=VALUE in one "
                   "argument each); 'auto': for each limit, the scaled transformer-multi30k "
                   "(width and depth, DENSE_GRID) whose measured latency is the largest under "
                   "it; none: no dense baselines")  # fmt: skip
    p.add_argument("--equal-compute", type=float, metavar="SECONDS",
                   help="each model trains the steps that fit SECONDS of its own quiet step "
                   "time (timed at planning); overrides --train-budget")  # fmt: skip
    p.add_argument(
        "--timing-steps",
        type=int,
        default=20,
        help="steps timed per model for --equal-compute (after 4 left out)",
    )
    p.add_argument("--train-budget", type=float, default=1800.0, help="seconds per model")
    p.add_argument("--train-steps", type=int, default=100_000, help="cap (and schedule length)")
    p.add_argument(
        "--smallest-seeds",
        type=int,
        default=1,
        help="seeds for the jobs at the lowest limit (the two smallest models)",
    )
    p.add_argument("--only", nargs="+", metavar="JOB", help="train only these jobs (names: "
                   "see OUT/plan.json)")  # fmt: skip
    p.add_argument("--plan-only", action="store_true", help="plan, measure and time; no training")
    p.add_argument("--no-train", action="store_true",
                   help="train nothing: --remeasure and the report only (jobs not trained yet "
                   "are listed as such)")  # fmt: skip
    p.add_argument("--dense-only", action="store_true",
                   help="plan and train the dense baselines only (no search, no anchors): a lane "
                   "that starts while the SuperTransformer still trains")  # fmt: skip
    p.add_argument("--pause", nargs="+", type=int, default=[], metavar="PID",
                   help="processes stopped (SIGSTOP) while this call measures latency or times "
                   "steps, continued after")  # fmt: skip
    p.add_argument("--remeasure", type=int, default=0, metavar="K",
                   help="after training, every model's latency measured again in K rounds "
                   "(one model after another in each round); the report's latency is the median "
                   "of all its measurements")  # fmt: skip
    p.add_argument("--eval-sentences", type=int, default=200)
    p.add_argument("--test-split", default="test_2016_flickr")
    p.add_argument("--test-sentences", type=int)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--runs", type=int, default=20, help="latency: timed runs")
    p.add_argument("--warmup", type=int, default=5, help="latency: warm-up runs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.equal_compute is not None and not (math.isfinite(args.equal_compute)
                                               and args.equal_compute > 0):  # fmt: skip
        p.error(f"--equal-compute must be a positive number of seconds, got {args.equal_compute}")
    if args.smallest_seeds < 1:
        p.error("--smallest-seeds must be at least 1")
    args.data = str(
        _data.require_dataset(
            __file__,
            args.data,
            "multi30k",
            is_dataset=_data.parallel_folder(),
            what="multi30k (train.*)",
        )
    )
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    supernet, tokenizer, meta = load_supernet_run(args.super)
    vocab = tokenizer.vocab_size
    pair = meta.get("pair") or {"src": "en", "tgt": "de"}
    task = TranslationTask(
        ParallelData(args.data, pair["src"], pair["tgt"]), tokenizer, max_tokens=4096,
        seed=args.seed, eval_sentences=args.eval_sentences, test_split=args.test_split,
    )  # fmt: skip
    predictor, pmeta = load_predictor(args.predictor)
    settings = LatencySettings(vocab_size=vocab, runs=args.runs, warmup=args.warmup,
                               threads=args.threads)  # fmt: skip
    space = supernet.config.space
    # Resumable: the records written before are read back, and every search, measurement and
    # model already recorded is skipped (a model interrupted mid-training resumes from its
    # folder's checkpoint).
    path = out / "results.jsonl"
    before = _read(path)
    results = open(path, "a")
    env = environment(torch.device("cpu"), "float32", args.threads, peak=False)
    _write(results, {"kind": "environment", **env, "loadavg": os.getloadavg(),
                     "argv": sys.argv[1:] if argv is None else argv,
                     "resumed": bool(before)})  # fmt: skip

    def recorded(kind: str, **match):
        for r in before:
            if r.get("kind") == kind and all(r.get(k) == v for k, v in match.items()):
                return r
        return None

    # -- 1. plan: searches, dense picks, anchors; latencies and timings -----------------------
    groups: list[dict] = []  # one per model: name, model, limit, the model's maker
    if args.anchors and not args.dense_only:
        for name, sub in representative_subtransformers(space).items():
            rec = recorded("anchor_inherited", name=name)
            if rec is None:
                rec = {"kind": "anchor_inherited", "name": name,
                       "inherited": _test(supernet.bind(sub), task, args)}  # fmt: skip
                _write(results, rec)
            groups.append({"group": f"anchor-{name}", "model": "anchor", "limit_ms": None,
                           "sub": sub.trimmed(), "description": sub.describe(),
                           "inherited": rec["inherited"]})  # fmt: skip
    # One fitness per SubTransformer for every search of this call and of a resumed one (the
    # searches under the two limits meet the same small SubTransformers): OUT/fitness.jsonl,
    # keyed by the trimmed SubTransformer, the SuperTransformer checkpoint and the sentences.
    fit_path = out / "fitness.jsonl"
    where = {"super": str(meta.get("step", "")), "sentences": args.fitness_sentences}
    fit_cache = {
        r["sub"]: r["loss"]
        for r in _read(fit_path)
        if r.get("super") == where["super"] and r.get("sentences") == where["sentences"]
    }
    batches = None

    def fitness(sub: SubTransformer) -> float:
        key = json.dumps(sub.trimmed().to_dict(), sort_keys=True)
        if key not in fit_cache:
            fit_cache[key] = validation_loss(supernet, sub, batches)
            with fit_path.open("a") as f:
                _write(f, {**where, "sub": key, "loss": fit_cache[key]})
        return fit_cache[key]

    for limit in [] if args.dense_only else args.limits:
        saved = out / f"search_{limit:g}.json"
        if saved.is_file():  # searched before: its best SubTransformer
            rec = json.loads(saved.read_text())
        else:
            if batches is None:
                batches = validation_batches(task, "valid", sentences=args.fitness_sentences)
            t0 = time.monotonic()
            r = search_subtransformer(
                supernet, predictor, limit, fitness=fitness, population=args.population,
                parents=args.parents, mutations=args.mutations, crossovers=args.crossovers,
                iterations=args.iterations, seed=args.seed, progress=not args.quiet,
            )  # fmt: skip
            rec = result_record(r, space.qkv_dim)
            rec["search_s"] = time.monotonic() - t0
            saved.write_text(json.dumps(rec, indent=2) + "\n")
        best = SubTransformer.from_dict(rec["best"])
        row = recorded("search", limit_ms=limit)
        if row is None:
            row = {"kind": "search", **{k: v for k, v in rec.items() if k != "evaluated"}}
            if args.inherited_bleu:
                row["inherited"] = _test(supernet.bind(best), task, args)
            _write(results, row)
        groups.append({"group": f"hat-{limit:g}", "model": "hat", "limit_ms": limit,
                       "sub": best.trimmed(), "description": best.describe(),
                       "predicted_ms": rec["best_predicted_ms"],
                       "inherited": row.get("inherited")})  # fmt: skip
    if args.dense == ["none"]:
        args.dense = []
    if args.dense == ["auto"]:
        grid = recorded("dense_grid")
        if grid is None:
            with paused(args.pause):
                picked = _dense_for_limits(args.limits, vocab, args, results)
        else:
            picked = _dense_for_limits(args.limits, vocab, args, results, grid["measured"])
        dense = [(f"dense-{limit:g}", limit, spec) for limit, spec in zip(args.limits, picked)
                 if spec is not None]  # fmt: skip
        for limit, spec in zip(args.limits, picked):
            if spec is None:
                print(f"--dense auto: no scaling of DENSE_GRID is under {limit:g} ms",
                      file=sys.stderr)  # fmt: skip
    else:
        dense = [(f"dense-{i}", None, spec) for i, spec in enumerate(args.dense)]
    for name, limit, spec in dense:
        groups.append({"group": name, "model": "dense", "limit_ms": limit, "overrides": spec,
                       "description": spec})  # fmt: skip

    def make(g: dict, seed: int):
        torch.manual_seed(seed)
        if g["model"] == "dense":
            return _dense_model(g["overrides"], vocab)
        return SuperTransformer(dataclasses.replace(supernet.config, sub=g["sub"]))

    def measure(g: dict) -> float:
        """Latency (ms) of a group's model, as the dataset was measured."""
        if g["model"] == "dense":
            return _dense_latency(g["overrides"], vocab, args)
        return measure_subtransformer(g["sub"], space, settings).total_s * 1e3

    timing_path = out / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    for g in groups:
        lat = recorded("latency", group=g["group"])
        if lat is None:
            with paused(args.pause) as stopped:
                ms = measure(g)
            lat = {"kind": "latency", "group": g["group"], "measured_ms": ms, "paused": stopped,
                   "runs": args.runs, "warmup": args.warmup}  # fmt: skip
            _write(results, lat)
        g["measured_ms"] = lat["measured_ms"]
        if args.equal_compute is not None:
            if g["group"] not in timing:
                with paused(args.pause) as stopped:
                    timing[g["group"]] = {**_time_steps(make(g, args.seed), task, args),
                                          "paused": stopped}  # fmt: skip
                timing_path.write_text(json.dumps(timing, indent=2) + "\n")
            g["step_s"] = timing[g["group"]]["step_s"]
            g["steps"] = allocate_steps({"x": g["step_s"]}, args.equal_compute)["x"]
    low = min(args.limits)
    jobs = []
    for g in groups:
        n = args.smallest_seeds if g["limit_ms"] == low else 1
        for seed in range(args.seed, args.seed + n):
            jobs.append(
                {
                    "name": f"{g['group']}-s{seed}",
                    "seed": seed,
                    **{k: (v.to_dict() if k == "sub" else v) for k, v in g.items()},
                }
            )
    (out / "plan.json").write_text(json.dumps(
        {"limits": args.limits, "equal_compute_s": args.equal_compute, "jobs": jobs}, indent=2
    ) + "\n")  # fmt: skip
    names = [j["name"] for j in jobs]
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            p.error(f"--only: no job {', '.join(unknown)}; the jobs: {', '.join(names)}")
    if args.plan_only:
        results.close()
        for j in jobs:
            print(
                f"{j['name']}: {j['description']}, {j['measured_ms']:.1f} ms"
                + (f", {j['steps']} steps at {j['step_s']:.3f} s" if "steps" in j else "")
            )
        return 0

    # -- 2. train -----------------------------------------------------------------------------
    by_group = {g["group"]: g for g in groups}
    for j in jobs:
        if args.no_train or (args.only and j["name"] not in args.only):
            continue
        if recorded("trained", name=j["name"]):
            continue
        g = by_group[j["group"]]
        model = make(g, j["seed"])
        fit = _train(model, task, args, out / j["name"], j.get("steps"), j["seed"])
        rec = {"kind": "trained", **j, "params": model.num_params(),
               **fit, **_test(model, task, args)}  # fmt: skip
        _write(results, rec)
        print(f"{j['name']}: {j['description']}: measured {j['measured_ms']:.1f} ms, "
              f"{fit['steps']} steps, BLEU {rec['bleu']:.2f}", flush=True)  # fmt: skip
    # -- 3. every model's latency again, in interleaved rounds (drift and neighbours touch all) --
    for k in range(args.remeasure):
        for g in groups:
            if recorded("remeasure", group=g["group"], round=k):
                continue
            with paused(args.pause) as stopped:
                ms = measure(g)
            _write(results, {"kind": "remeasure", "group": g["group"], "round": k,
                             "measured_ms": ms, "paused": stopped, "runs": args.runs,
                             "warmup": args.warmup})  # fmt: skip
    results.close()
    # -- 4. report ----------------------------------------------------------------------------
    report(out, args.test_split, args.beam)
    return 0


if __name__ == "__main__":
    sys.exit(main())
