"""Lite Transformer against the dense Transformer at equal Mult-Adds on Multi30k En->De, each
model trained for the same *quiet* CPU time (issue 27), resumable, two models at a time.

The models and the recipe are those of ``benchmarks/lite_vs_dense_multi30k.py`` (Lite widths
``--lite-dims``, each dense ``transformer-multi30k`` width matched to a Lite model's Mult-Adds;
Adam (0.9, 0.98), eps 1e-9, inverse-sqrt schedule, label smoothing 0.1, dropout 0.1, token
batches of ``--max-tokens``). What differs is how the budget is given, so that it survives a
shared machine:

1. ``--phase time``: each model's training step is timed alone, one thread (``--time-steps``
   steps after ``--time-skip`` warm-up steps, their mean ``step_s``), into ``OUT/timing.json``;
   run it on a quiet machine (the load average is recorded beside each timing).
2. ``--phase train [--lane I/N]``: each model trains ``round(--equal-time / step_s)`` steps, so
   every model gets the same quiet single-thread seconds whatever else runs beside it later;
   ``--lane I/N`` trains the runs whose plan index is I mod N (lane 0/2: the Lite models, 1/2:
   the dense ones), so two processes on two cores never share a run. The smallest pair also
   trains ``--seeds-smallest`` seeds. Along the way validation BLEU (greedy, ``--eval-sentences``
   sentences) every tenth of the run; checkpoints every fortieth, the last ``--average`` kept.
   At the end test BLEU (sacreBLEU, chrF) on ``--test-split`` under two conventions:
   ``last``: the last checkpoint, beam 5, length penalty 1 (fairseq-generate's defaults, the
   earlier figures'); ``avg``: the average of the last ``--average`` checkpoints, beam 4,
   length penalty 1 (Lite Transformer's small-data convention, ``configs/iwslt14.de-en/test.sh``;
   :data:`effiformer.recipes.LITE_IWSLT_DECODING`). A killed run resumes from its last
   checkpoint; a recorded run is skipped.
3. ``--phase latency``: on the quiet machine again, the decoding latency of every trained model
   (one 30-token sentence, batch 1, beam 5, one thread: :func:`effiformer.bench.decoding.
   decoding_latency`).
4. ``--phase report``: ``OUT/table.md``, ``OUT/bleu_vs_mult_adds.png``, ``OUT/bleu_vs_time.png``
   (validation BLEU against estimated quiet minutes), ``OUT/bleu_vs_latency.png``.

Records go to ``OUT/results.jsonl`` (kinds ``environment``, ``run``, ``latency``); checkpoints to
``RUNS/NAME`` (``--runs``, default ``OUT/runs``: keep it out of git).

    python benchmarks/lite_vs_dense_equal_time.py --phase time --out OUT
    python benchmarks/lite_vs_dense_equal_time.py --phase train --lane 0/2 --out OUT &
    python benchmarks/lite_vs_dense_equal_time.py --phase train --lane 1/2 --out OUT
    python benchmarks/lite_vs_dense_equal_time.py --phase latency --out OUT
    python benchmarks/lite_vs_dense_equal_time.py --phase report --out OUT

``benchmarks/lite_vs_dense_1200s.sh`` holds the commands as run for the committed figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from effiformer import create_model
from effiformer.bench import environment
from effiformer.data import ParallelData
from effiformer.flops import count_parameters
from effiformer.metrics import translation_scores
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402
from lite_vs_dense_multi30k import plan  # noqa: E402

PHASES = ("time", "train", "latency", "report")


def _write(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def runs_of(lite_dims: list[int], seeds_smallest: int) -> list[dict]:
    """The plan with seeds, in training order: the smallest pair's seeds first, then the larger
    pairs; Lite at even indices, dense at odd ones (lanes 0/2 and 1/2)."""
    pairs = plan(lite_dims)
    out = []
    for i in range(0, len(pairs), 2):
        seeds = range(seeds_smallest) if i == 0 else range(1)
        for s in seeds:
            for r in pairs[i : i + 2]:
                out.append({**r, "seed": s, "name": f"{r['kind']}-d{r['dim']}-s{s}"})
    return out


def _task(args, seed: int) -> TranslationTask:
    return TranslationTask(
        ParallelData(args.data, args.src, args.tgt),
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        seed=seed,
        eval_sentences=args.eval_sentences,
        test_split=args.test_split,
    )


def _config(args, r: dict, steps: int, **kw) -> TrainConfig:
    return TrainConfig(
        steps=steps, optimizer="adam", lr=args.lr, betas=(0.9, 0.98), eps=1e-9,
        weight_decay=0.0, warmup=args.warmup, schedule="inverse_sqrt", clip=None,
        seed=r["seed"], device="cpu", progress=False, log_every=25, model_name=r["model"],
        task="translation", **kw,
    )  # fmt: skip


def _model(r: dict, vocab: int, seed: int):
    torch.manual_seed(seed)
    return create_model(r["model"], vocab_size=vocab, **r["overrides"])


def phase_time(args, out: Path, runs: list[dict]) -> None:
    path = out / "timing.json"
    timing = json.loads(path.read_text()) if path.exists() else {}
    task = _task(args, 0)
    for r in runs:
        key = f"{r['kind']}-d{r['dim']}"
        if key in timing:
            continue
        model = _model(r, task.tokenizer.vocab_size, 0)
        h = train(model, task, _config(args, r, args.time_skip + args.time_steps))
        times = [t["step_s"] for t in h.train][args.time_skip :]
        timing[key] = {
            "step_s": statistics.fmean(times), "step_s_median": statistics.median(times),
            "steps_timed": len(times), "threads": torch.get_num_threads(),
            "loadavg": os.getloadavg(), "cpu_count": os.cpu_count(),
        }  # fmt: skip
        path.write_text(json.dumps(timing, indent=1) + "\n")
        print(f"timed {key}: {timing[key]['step_s']:.3f} s/step", flush=True)


def _curve(run_dir: Path) -> list[dict]:
    return [
        {k: r[k] for k in ("step", "val_bleu", "val_nll", "val_loss") if k in r}
        for r in _read(run_dir / "metrics.jsonl")
        if "val_bleu" in r
    ]


def _test(task, model, args, beam: int, lenpen: float) -> dict:
    task.eval_sentences = args.test_sentences
    t0 = time.monotonic()
    hyps, refs = task.hypotheses(model, args.test_split, beam=beam, lenpen=lenpen)
    seconds = time.monotonic() - t0
    task.eval_sentences = args.eval_sentences
    return {**translation_scores(hyps, refs), "beam": beam, "lenpen": lenpen,
            "sentences": len(hyps), "decode_s": seconds, "hyps": hyps}  # fmt: skip


def phase_train(args, out: Path, runs: list[dict], runs_dir: Path) -> None:
    from effiformer.average import average_run
    from effiformer.checkpoint import LATEST, load_checkpoint

    timing = json.loads((out / "timing.json").read_text())
    done = {r["name"] for r in _read(out / "results.jsonl") if r.get("kind") == "run"}
    lane, n = (int(x) for x in args.lane.split("/"))
    tasks: dict[int, TranslationTask] = {}
    for i, r in enumerate(runs):
        if i % n != lane or r["name"] in done:
            continue
        key = f"{r['kind']}-d{r['dim']}"
        step_s = timing[key]["step_s"]
        steps = max(1, round(args.equal_time / step_s))
        if r["seed"] not in tasks:
            tasks[r["seed"]] = _task(args, r["seed"])
        task = tasks[r["seed"]]
        run_dir = runs_dir / r["name"]
        resume = str(run_dir) if (run_dir / LATEST).exists() else None
        model = _model(r, task.tokenizer.vocab_size, r["seed"])
        cfg = _config(
            args, r, steps, out_dir=str(run_dir), resume=resume,
            eval_every=max(1, steps // 10), checkpoint_every=max(1, steps // 40),
            keep_checkpoints=args.average,
        )  # fmt: skip
        print(f"{r['name']}: {steps} steps ({step_s:.3f} s/step quiet)"
              + (f", resuming {resume}" if resume else ""), flush=True)  # fmt: skip
        t0 = time.monotonic()
        history = train(model, task, cfg)
        wall = time.monotonic() - t0
        model.eval()
        last = _test(task, model, args, beam=5, lenpen=1.0)
        avg_dir = runs_dir / f"{r['name']}-avg{args.average}"
        if not (avg_dir / LATEST).exists():
            average_run(run_dir, args.average, avg_dir)
        avg_model, _ = load_checkpoint(avg_dir)
        avg_model.eval()
        avg = _test(task, avg_model, args, beam=4, lenpen=1.0)
        for tag, res in (("last", last), ("avg", avg)):
            (run_dir / f"{args.test_split}.{tag}.hyp.{args.tgt}").write_text(
                "\n".join(res.pop("hyps")) + "\n"
            )
        rec = {
            "kind": "run", "name": r["name"], "family": r["kind"], "model": r["model"],
            "dim": r["dim"], "seed": r["seed"], "overrides": r["overrides"],
            "mult_adds": r["mult_adds"], "params_no_embeddings": count_parameters(model),
            "params": model.num_params(), "steps": history.step, "quiet_step_s": step_s,
            "equal_time_s": args.equal_time, "quiet_train_s": history.step * step_s,
            "wall_s_last_process": wall, "loadavg_end": os.getloadavg(),
            "curve": _curve(run_dir), "test_split": args.test_split,
            "test_last": last, "test_avg": {**avg, "averaged": args.average},
            "recipe": {"optimizer": "adam", "lr": args.lr, "betas": [0.9, 0.98], "eps": 1e-9,
                       "schedule": "inverse_sqrt", "warmup": args.warmup,
                       "max_tokens": args.max_tokens, "label_smoothing": 0.1},
        }  # fmt: skip
        _write(out / "results.jsonl", rec)
        print(
            f"{r['name']}: {history.step} steps; test BLEU {last['bleu']:.2f} (last, beam 5), "
            f"{avg['bleu']:.2f} (avg {args.average}, beam 4)",
            flush=True,
        )


def phase_latency(args, out: Path, runs: list[dict], runs_dir: Path) -> None:
    from effiformer.bench.decoding import decoding_latency
    from effiformer.checkpoint import load_checkpoint

    have = {r["name"] for r in _read(out / "results.jsonl") if r.get("kind") == "latency"}
    trained = {r["name"] for r in _read(out / "results.jsonl") if r.get("kind") == "run"}
    for r in runs:
        if r["name"] in have or r["name"] not in trained:
            continue
        model, _ = load_checkpoint(runs_dir / r["name"])
        model.eval()
        lat = decoding_latency(model, src_len=30, beam=5, runs=args.latency_runs, warmup=3,
                               threads=1)  # fmt: skip
        rec = {"kind": "latency", "name": r["name"], "latency_ms": lat.total_s * 1e3,
               "latency_encoder_ms": lat.encoder_s * 1e3, "beam": 5, "src_len": 30,
               "threads": 1, "runs": args.latency_runs, "loadavg": os.getloadavg()}  # fmt: skip
        _write(out / "results.jsonl", rec)
        print(f"{r['name']}: {rec['latency_ms']:.1f} ms", flush=True)


def _summary(records: list[dict]) -> list[dict]:
    """One row per model (seeds pooled): mean and each seed's test BLEU."""
    lat = {r["name"]: r for r in records if r.get("kind") == "latency"}
    rows: dict[str, dict] = {}
    for r in (r for r in records if r.get("kind") == "run"):
        key = f"{r['family']}-d{r['dim']}"
        row = rows.setdefault(key, {"key": key, "family": r["family"], "dim": r["dim"],
                                    "mult_adds": r["mult_adds"], "runs": []})  # fmt: skip
        row["runs"].append({**r, "latency_ms": lat.get(r["name"], {}).get("latency_ms")})
    for row in rows.values():
        for tag in ("last", "avg"):
            vals = [x[f"test_{tag}"]["bleu"] for x in row["runs"]]
            row[f"bleu_{tag}"] = statistics.fmean(vals)
            row[f"bleu_{tag}_seeds"] = vals
        lats = [x["latency_ms"] for x in row["runs"] if x["latency_ms"] is not None]
        row["latency_ms"] = statistics.fmean(lats) if lats else None
    return sorted(rows.values(), key=lambda r: (r["mult_adds"], r["family"]))


def _pair_lines(rows: list[dict]) -> list[str]:
    """Lite minus dense test BLEU per Mult-Adds pair (rows sorted by Mult-Adds: each Lite model
    beside the dense model matched to it), per seed where both have it."""
    lite = [r for r in rows if r["family"] == "lite"]
    dense = [r for r in rows if r["family"] == "dense"]
    out = ["| pair | Lite - dense, last checkpoint, beam 5 | Lite - dense, average, beam 4 |",
           "|---|---:|---:|"]  # fmt: skip
    for a, b in zip(sorted(lite, key=lambda r: r["mult_adds"]),
                    sorted(dense, key=lambda r: r["mult_adds"])):  # fmt: skip
        cells = []
        for tag in ("last", "avg"):
            seeds = [x - y for x, y in zip(a[f"bleu_{tag}_seeds"], b[f"bleu_{tag}_seeds"])]
            text = f"{a[f'bleu_{tag}'] - b[f'bleu_{tag}']:+.2f}"
            if len(seeds) > 1:
                text += f" (per seed {', '.join(f'{v:+.2f}' for v in seeds)})"
            cells.append(text)
        out.append(f"| {a['key']} vs {b['key']} | {cells[0]} | {cells[1]} |")
    return out


def phase_report(args, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _read(out / "results.jsonl")
    rows = _summary(records)
    lines = [
        "| model | Mult-Adds (M) | params (M, no emb.) | steps | quiet min | test BLEU last, "
        "beam 5 | test BLEU avg, beam 4 | chrF (avg) | latency (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rs = row["runs"]

        def fmt(tag, row=row):
            seeds = row[f"bleu_{tag}_seeds"]
            if len(seeds) == 1:
                return f"{seeds[0]:.2f}"
            return f"{row[f'bleu_{tag}']:.2f} ({', '.join(f'{v:.2f}' for v in seeds)})"

        chrf = statistics.fmean(x["test_avg"]["chrf"] for x in rs)
        lat = "" if row["latency_ms"] is None else f"{row['latency_ms']:.1f}"
        lines.append(
            f"| {row['key']} | {row['mult_adds'] / 1e6:.1f} | "
            f"{rs[0]['params_no_embeddings'] / 1e6:.2f} | {rs[0]['steps']} | "
            f"{rs[0]['quiet_train_s'] / 60:.1f} | {fmt('last')} | {fmt('avg')} | {chrf:.1f} | "
            f"{lat} |"
        )
    lines += ["", *_pair_lines(rows)]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    styles = {"lite": ("o-", "Lite Transformer"), "dense": ("s--", "Transformer")}
    for xkey, fname, xlabel in (
        ("mult_adds", "bleu_vs_mult_adds.png", "Mult-Adds (M, one 30-token sentence)"),
        ("latency_ms", "bleu_vs_latency.png", "decoding latency (ms, batch 1, beam 5, 1 thread)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for fam, (style, label) in styles.items():
            rs = [r for r in rows if r["family"] == fam and r.get(xkey) is not None]
            if not rs:
                continue
            scale = 1e6 if xkey == "mult_adds" else 1.0
            xs = [r[xkey] / scale for r in rs]
            ax.plot(xs, [r["bleu_avg"] for r in rs], style, label=label)
            for r, x in zip(rs, xs):
                for v in r["bleu_avg_seeds"]:
                    ax.plot([x], [v], style[0], color="grey", alpha=0.5, ms=4)
                ax.annotate(f"d {r['dim']}", (x, r["bleu_avg"]), fontsize=7,
                            textcoords="offset points", xytext=(4, -10))  # fmt: skip
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{args.test_split} sacreBLEU (avg, beam 4)")
        ax.set_title(f"Multi30k En->De, {args.equal_time / 60:.0f} quiet CPU min per model")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {}
    for r in (r for r in records if r.get("kind") == "run"):
        key = f"{r['family']}-d{r['dim']}"
        color = colors.setdefault(key, f"C{len(colors)}")
        xs = [c["step"] * r["quiet_step_s"] / 60 for c in r["curve"]]
        ys = [c["val_bleu"] for c in r["curve"]]
        ax.plot(xs, ys, "-" if r["family"] == "lite" else "--", color=color,
                label=key if r["seed"] == 0 else None, alpha=1.0 if r["seed"] == 0 else 0.5)  # fmt: skip
    ax.set_xlabel("estimated quiet CPU minutes (steps x quiet step time, one thread)")
    ax.set_ylabel("validation BLEU (greedy)")
    ax.set_title("Multi30k En->De: validation BLEU along training (Lite solid, dense dashed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bleu_vs_time.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _data.add_data_flag(p, itself="the Multi30k folder")
    p.add_argument("--phase", choices=PHASES, required=True)
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--lite-dims", nargs="+", type=int, default=[128, 192, 256])
    p.add_argument("--seeds-smallest", type=int, default=2, help="seeds of the smallest pair")
    p.add_argument("--equal-time", type=float, default=1200.0,
                   help="quiet single-thread training seconds per model")  # fmt: skip
    p.add_argument("--time-steps", type=int, default=20)
    p.add_argument("--time-skip", type=int, default=3)
    p.add_argument("--lane", default="0/1", help="I/N: train the runs whose index is I mod N")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--average", type=int, default=10, help="checkpoints averaged (avg)")
    p.add_argument("--eval-sentences", type=int, default=200)
    p.add_argument("--test-split", default="test_2016_flickr")
    p.add_argument("--test-sentences", type=int, help="test sentences (default all)")
    p.add_argument("--latency-runs", type=int, default=10)
    p.add_argument("--runs", help="checkpoint folder (default OUT/runs)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "report":
        phase_report(args, out)
        return 0
    args.data = str(
        _data.require_dataset(
            __file__, args.data, "multi30k",
            is_dataset=_data.parallel_folder(args.src, args.tgt),
            what=f"multi30k (train.{args.src}, train.{args.tgt})",
        )
    )  # fmt: skip
    try:
        lane, n = (int(x) for x in args.lane.split("/"))
        assert 0 <= lane < n
    except (ValueError, AssertionError):
        p.error(f"--lane must be I/N with 0 <= I < N, got {args.lane!r}")
    torch.set_num_threads(1)
    runs = runs_of(args.lite_dims, args.seeds_smallest)
    runs_dir = Path(args.runs) if args.runs else out / "runs"
    env = environment(torch.device("cpu"), "float32", 1, peak=False)
    _write(out / "results.jsonl", {"kind": "environment", "phase": args.phase, **env,
                                   "loadavg": os.getloadavg(),
                                   "argv": sys.argv[1:] if argv is None else argv})  # fmt: skip
    if args.phase == "time":
        phase_time(args, out, runs)
    elif args.phase == "train":
        phase_train(args, out, runs, runs_dir)
    else:
        phase_latency(args, out, runs, runs_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
