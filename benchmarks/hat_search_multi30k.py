"""HAT on Multi30k, end to end on this CPU: evolutionary search in a trained SuperTransformer under
two latency limits, the chosen SubTransformers trained from scratch, compared with dense
Transformers of similar measured latency: test BLEU against measured latency (HAT fig. 5 / 6 on
this data).

Inputs: a SuperTransformer run (``benchmarks/hat_supernet_multi30k.py``) and a latency predictor
trained on this machine (``benchmarks/hat_latency_multi30k.py``). For each ``--limits`` value:

1. search (HAT's evolution: population 125 = 25 + 50 + 50, mutation 0.3, ``--iterations`` 30;
   fitness = validation loss of the inherited SubTransformer on the first ``--fitness-sentences``
   of ``val``; every candidate under the predicted limit);
2. test BLEU of the inherited SubTransformer (no retraining; HAT table 5) if
   ``--inherited-bleu``;
3. train it from scratch (a standalone ``hat`` model of its size: ``HATConfig(sub=best)``) with
   the translation task and ``effiformer.train.train`` for ``--train-budget`` seconds, the recipe
   of the SuperTransformer run (Adam (0.9, 0.98), lr 1e-3, 1000 warmup steps, inverse sqrt,
   label smoothing 0.1, 4096-token batches);
4. measure its latency as the dataset was measured (batch 1, 30 tokens, beam 5, 20 runs).

The dense baselines (``--dense``: override sets of ``transformer-multi30k``, or ``auto``: for each
limit the width/depth scaling of ``DENSE_GRID`` whose measured latency is the largest under it)
are measured and trained the same way. ``--anchors``: HAT's inherited-vs-from-scratch check, the
largest and smallest SubTransformers scored with inherited weights and trained from scratch for
the same budget. Test BLEU: sacreBLEU on ``test_2016_flickr``, beam 5, lenpen 1.

Resumable: rerun the same command with the same ``--out`` and every search, model and anchor
already recorded in ``results.jsonl`` is skipped (a search reloads ``search_<limit>.json``; a
model interrupted mid-training resumes from its folder's checkpoint, written every 250 steps).

    python benchmarks/hat_search_multi30k.py --super runs/hat-super \\
        --predictor runs/hat-lat/predictor.pt --limits 150 220 --train-budget 1800 \\
        --out runs/hat-search                                              # ~4-5 h idle
    python benchmarks/hat_search_multi30k.py --super /tmp/hat-super \\
        --predictor /tmp/hat-lat/predictor.pt --limits 1e6 --iterations 1 --population 6 \\
        --parents 2 --mutations 2 --crossovers 2 --fitness-sentences 20 --train-steps 3 \\
        --test-sentences 10 --runs 2 --warmup 0 --dense decoder_layers=1 --out /tmp/hat-search

Writes ``OUT/results.jsonl`` (environment, searches, trained models with their BLEU and measured
latency), ``OUT/search_<limit>.json`` and ``OUT/bleu_vs_latency.png``.

The parallel text is read from ``multi30k/`` under the data folder: ``--data DIR``, else
``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (``--data`` may also name the
Multi30k folder itself, as before); without it the script stops at once with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from effiformer import create_model
from effiformer.bench.decoding import decoding_latency
from effiformer.bench.harness import environment
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
)
from effiformer.search.latency import LatencySettings, measure_subtransformer
from effiformer.search.plots import plot_frontier
from effiformer.search.predictor import load_predictor
from effiformer.tasks.supernet import representative_subtransformers
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
DENSE = ["decoder_layers=1", "decoder_layers=2", "n_layers=2 decoder_layers=2 dim=192 n_heads=4"]


def _write(f, rec: dict) -> None:
    f.write(json.dumps(rec) + "\n")
    f.flush()


def _train(model, task: TranslationTask, args, out_dir: Path) -> dict:
    """Train from scratch (resuming the folder's checkpoint after an interruption: the step
    budget ``--train-steps`` then continues; a time budget restarts its clock)."""
    resume = (out_dir / LATEST).is_file()
    cfg = TrainConfig(
        steps=args.train_steps, optimizer="adam", lr=1e-3, betas=(0.9, 0.98), eps=1e-8,
        weight_decay=0.0, warmup=min(1000, max(1, args.train_steps // 10)),
        schedule="inverse_sqrt", clip=None, seed=args.seed, device="cpu",
        time_budget=args.train_budget, eval_every=None, out_dir=str(out_dir), log_every=25,
        progress=not args.quiet, checkpoint_every=250, resume=str(out_dir) if resume else None,
    )  # fmt: skip
    t0 = time.monotonic()
    history = train(model, task, cfg)
    return {"steps": history.step, "train_s": time.monotonic() - t0,
            "last_loss": history.losses[-1] if history.losses else None}  # fmt: skip


def _key(r: dict) -> tuple:
    """What a record marks as done (see the resumable loop in :func:`main`)."""
    kind = r.get("kind")
    if kind == "search":
        return ("search", r["limit_ms"])
    if kind == "trained":
        return ("trained", r["model"], r["limit_ms"] if r["model"] == "hat" else r["overrides"])
    if kind == "anchor":
        return ("anchor", r["name"])
    return (kind,)


#: Width and depth scalings of transformer-multi30k that ``--dense auto`` measures.
DENSE_GRID = [
    f"n_layers={n} decoder_layers={m} dim={d} n_heads={d // 64} ffn_dim={4 * d}"
    for d in (128, 192, 256) for n in (1, 2, 3) for m in (1, 2, 3)
]  # fmt: skip


def _dense_for_limits(limits, vocab: int, args, results) -> list[str]:
    """For each latency limit, the DENSE_GRID scaling whose measured latency (batch 1, beam 5,
    the dataset's setting) is the largest under it: the dense model of that latency."""
    measured = []
    for spec in DENSE_GRID:
        over = parse_overrides(create_model("transformer-multi30k").config, spec.split())
        model = create_model("transformer-multi30k", vocab_size=vocab, **over).eval()
        lat = decoding_latency(model, src_len=30, beam=5, runs=args.runs, warmup=args.warmup,
                               threads=args.threads)  # fmt: skip
        measured.append((lat.total_s * 1e3, spec))
    _write(results, {"kind": "dense_grid", "measured": [[ms, spec] for ms, spec in measured]})
    picked = []
    for limit in limits:
        under = [(ms, spec) for ms, spec in measured if ms <= limit]
        if under:
            picked.append(max(under)[1])
    return list(dict.fromkeys(picked))


def _test(model, task: TranslationTask, args) -> dict:
    task.eval_sentences = args.test_sentences
    try:
        r = task.evaluate(model, args.test_split, beam=args.beam)
    finally:
        task.eval_sentences = args.eval_sentences
    return {"bleu": r["bleu"], "chrf": r["chrf"], "test_loss": r["loss"],
            "sentences": r["sentences"], "bleu_signature": r["bleu_signature"]}  # fmt: skip


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
    p.add_argument("--train-budget", type=float, default=1800.0, help="seconds per model")
    p.add_argument("--train-steps", type=int, default=100_000, help="cap (and schedule length)")
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
    pair = meta.get("pair") or {"src": "en", "tgt": "de"}
    task = TranslationTask(
        ParallelData(args.data, pair["src"], pair["tgt"]), tokenizer, max_tokens=4096,
        seed=args.seed, eval_sentences=args.eval_sentences, test_split=args.test_split,
    )  # fmt: skip
    predictor, pmeta = load_predictor(args.predictor)
    settings = LatencySettings(vocab_size=tokenizer.vocab_size, runs=args.runs,
                               warmup=args.warmup, threads=args.threads)  # fmt: skip
    batches = validation_batches(task, "valid", sentences=args.fitness_sentences)
    space = supernet.config.space
    # Resumable: the records written before are read back, and every search, model and
    # measurement already recorded is skipped (a model interrupted mid-training resumes from its
    # folder's checkpoint).
    path = out / "results.jsonl"
    before = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    done = {_key(r) for r in before}
    results = open(path, "a")
    env = environment(torch.device("cpu"), "float32", args.threads, peak=False)
    _write(results, {"kind": "environment", **env, "loadavg": os.getloadavg(),
                     "argv": sys.argv[1:] if argv is None else argv,
                     "resumed": bool(before)})  # fmt: skip
    trained = {"hat": [r for r in before if r.get("kind") == "trained" and r["model"] == "hat"],
               "dense": [r for r in before if r.get("kind") == "trained" and r["model"] == "dense"]}  # fmt: skip
    searches = []
    if args.anchors:
        for name, sub in representative_subtransformers(space).items():
            if ("anchor", name) in done:
                continue
            inherited = _test(supernet.bind(sub), task, args)
            torch.manual_seed(args.seed)
            model = SuperTransformer(dataclasses.replace(supernet.config, sub=sub.trimmed()))
            fit = _train(model, task, args, out / f"anchor_{name}")
            rec = {"kind": "anchor", "name": name, "sub": sub.to_dict(),
                   "description": sub.describe(), "params": model.num_params(),
                   "inherited": inherited, **fit, **_test(model, task, args)}  # fmt: skip
            _write(results, rec)
            print(f"{name}: inherited BLEU {inherited['bleu']:.2f}, from scratch "
                  f"{rec['bleu']:.2f} ({fit['steps']} steps)", flush=True)  # fmt: skip
    for limit in args.limits:
        saved = out / f"search_{limit:g}.json"
        if saved.is_file():  # searched before: its best SubTransformer
            rec = json.loads(saved.read_text())
            best = SubTransformer.from_dict(rec["best"])
            predicted = rec["best_predicted_ms"]
        else:
            t0 = time.monotonic()
            r = search_subtransformer(
                supernet, predictor, limit, batches, population=args.population,
                parents=args.parents, mutations=args.mutations, crossovers=args.crossovers,
                iterations=args.iterations, seed=args.seed, progress=not args.quiet,
            )  # fmt: skip
            rec = result_record(r, space.qkv_dim)
            rec["search_s"] = time.monotonic() - t0
            saved.write_text(json.dumps(rec, indent=2) + "\n")
            searches.append(r)
            best, predicted = r.best, r.best_latency
        if ("search", limit) not in done:
            row = {"kind": "search", **{k: v for k, v in rec.items() if k != "evaluated"}}
            if args.inherited_bleu:
                row["inherited"] = _test(supernet.bind(best), task, args)
            _write(results, row)
        if ("trained", "hat", limit) in done:
            continue
        torch.manual_seed(args.seed)
        model = SuperTransformer(dataclasses.replace(supernet.config, sub=best.trimmed()))
        fit = _train(model, task, args, out / f"hat_{limit:g}")
        lat = measure_subtransformer(best, space, settings)
        rec = {"kind": "trained", "model": "hat", "limit_ms": limit, "sub": best.to_dict(),
               "description": best.describe(), "params": model.num_params(), **fit,
               "measured_ms": lat.total_s * 1e3, "predicted_ms": predicted,
               **_test(model, task, args)}  # fmt: skip
        _write(results, rec)
        trained["hat"].append(rec)
        print(f"HAT @{limit:g} ms: {best.describe()}: measured {rec['measured_ms']:.1f} ms, "
              f"BLEU {rec['bleu']:.2f}", flush=True)  # fmt: skip
    if args.dense == ["auto"]:
        args.dense = _dense_for_limits(args.limits, tokenizer.vocab_size, args, results)
    for spec in args.dense:
        if ("trained", "dense", spec) in done:
            continue
        over = parse_overrides(create_model("transformer-multi30k").config, spec.split())
        torch.manual_seed(args.seed)
        model = create_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, **over)
        fit = _train(model, task, args, out / f"dense_{spec.replace(' ', '_').replace('=', '')}")
        lat = decoding_latency(model, src_len=30, beam=5, runs=args.runs, warmup=args.warmup,
                               threads=args.threads)  # fmt: skip
        rec = {"kind": "trained", "model": "dense", "overrides": spec,
               "params": model.num_params(), **fit, "measured_ms": lat.total_s * 1e3,
               **_test(model, task, args)}  # fmt: skip
        _write(results, rec)
        trained["dense"].append(rec)
        print(f"dense {spec}: measured {rec['measured_ms']:.1f} ms, BLEU {rec['bleu']:.2f}",
              flush=True)  # fmt: skip
    results.close()
    series = [
        {"label": "HAT SubTransformer (from scratch)", "x": [r["measured_ms"] for r in trained["hat"]],
         "y": [r["bleu"] for r in trained["hat"]], "style": "-*", "size": 12},
    ]  # fmt: skip
    if trained["dense"]:
        series.append({"label": "dense Transformer", "x": [r["measured_ms"] for r in trained["dense"]],
                       "y": [r["bleu"] for r in trained["dense"]], "style": "-o"})  # fmt: skip
    plot_frontier(series, out / "bleu_vs_latency.png", xlabel="measured latency on this CPU (ms)",
                  ylabel=f"test BLEU ({args.test_split}, beam {args.beam})",
                  title="Multi30k En->De: HAT vs dense", limits=args.limits)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
