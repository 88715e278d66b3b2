"""Transformer-XL and Compressive Transformer: does a longer memory at evaluation lower the loss?

Both families train on segments with a memory of fixed size; the Transformer-XL paper evaluates
its trained models with a longer memory than they trained with (enwik8: trained with 512,
evaluated with 1,600 at ``clamp_len`` 1,000) and reports that longer evaluation memory helps. This
script takes the trained XL and Compressive cells of a quality run (``effiformer bench --part
quality``, for example ``benchmarks/long_context_cpu.sh``) and scores each trained model, without
changing a weight, with its memory (and the Compressive model's compressed memory) at 0.5x, 1x, 2x
and 4x the training size, and, above 1x, once more with ``clamp_len`` at the longest distance seen
in training (segment + memory: distances beyond it share one relative-position encoding).

Evaluation is one contiguous stream (batch 1, so a stream is long enough to fill even the 4x
memory) over the first ``--eval-tokens`` characters of the validation split, or all of it with
``--whole-split``; the records say how many. Resumable: each (cell, factor, clamp) is one line of ``OUT/memory_eval.jsonl`` and is skipped
when present. Writes ``OUT/memory_eval.md`` (table) and ``OUT/memory_eval.png`` (bpc against
evaluation memory).

    python benchmarks/long_context_memory.py --out benchmarks/results/long_context_cpu \\
        --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

FACTORS = (0.5, 1.0, 2.0, 4.0)
RESULTS = "memory_eval.jsonl"


def _cells(out: Path, mechanisms: list[str]) -> list[dict[str, Any]]:
    """The finished (``ok``) cells of ``mechanisms`` in the quality run at ``out``."""
    from effiformer.bench.quality import RESULTS as QRESULTS
    from effiformer.bench.quality import _read_results

    recs = _read_results(out / QRESULTS).values()
    return sorted(
        (r for r in recs if r.get("mechanism") in mechanisms and r.get("status") == "ok"),
        key=lambda r: r["cell"],
    )


def _plan(rec: dict[str, Any], factors: tuple[float, ...]) -> list[dict[str, Any]]:
    """The evaluations of one trained cell: its memory sizes scaled by each factor, and above 1x
    once more with ``clamp_len`` at the training context (segment + memory)."""
    over = rec["overrides"]
    seg, mem, cmem = int(over["seq_len"]), int(over["mem_len"]), int(over.get("cmem_len") or 0)
    train_context = seg + mem + cmem
    plan = []
    for f in factors:
        setting = {"mem_len": round(mem * f)}  # factor 0: no memory (each segment alone)
        if cmem:
            setting["cmem_len"] = round(cmem * f)
        plan.append({"factor": f, "clamp_len": None, **setting})
        if f > 1:
            plan.append({"factor": f, "clamp_len": train_context, **setting})
    return plan


def _key(cell: str, e: dict[str, Any]) -> str:
    return f"{cell}|x{e['factor']:g}|clamp{e['clamp_len']}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the quality run's folder")
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--mechanisms", nargs="+", default=["xl", "compressive"])
    p.add_argument("--factors", nargs="+", type=float, default=list(FACTORS))
    p.add_argument("--eval-tokens", type=int, default=131072,
                   help="characters of the validation split scored (default 131,072)")  # fmt: skip
    p.add_argument("--whole-split", action="store_true",
                   help="score the whole validation split instead of --eval-tokens")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot-only", action="store_true", help="only redraw the table and plot")
    args = p.parse_args(argv)
    if any(f < 0 for f in args.factors):
        p.error(f"--factors must be >= 0, got {args.factors}")
    if args.eval_tokens <= 0:
        p.error(f"--eval-tokens must be positive, got {args.eval_tokens}")
    torch.set_num_threads(args.threads)

    from effiformer.bench.quality import LM_DATA
    from effiformer.checkpoint import load_checkpoint, resolve_checkpoint
    from effiformer.data import load_corpus
    from effiformer.tasks.lm import LMTask

    results = args.out / RESULTS
    done: dict[str, dict[str, Any]] = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    cells = _cells(args.out, args.mechanisms)
    if not cells and not done:
        print(f"no finished {'/'.join(args.mechanisms)} cell in {args.out}", file=sys.stderr)
        return 1
    corpora: dict[str, Any] = {}
    for rec in [] if args.plot_only else cells:
        run_dir = args.out / "cells" / rec["cell"].replace("/", "_")
        todo = [e for e in _plan(rec, tuple(args.factors)) if _key(rec["cell"], e) not in done]
        if not todo:
            continue
        model, _ = load_checkpoint(resolve_checkpoint(run_dir), map_location="cpu")
        model.eval()
        rel, fmt = LM_DATA[rec["task"]]
        if rec["task"] not in corpora:
            corpora[rec["task"]] = load_corpus(args.data / rel, fmt)
        for e in todo:
            over = {k: e[k] for k in ("mem_len", "cmem_len", "clamp_len") if k in e}
            n_tokens = None if args.whole_split else args.eval_tokens
            task = LMTask(corpora[rec["task"]], seq_len=int(rec["overrides"]["seq_len"]),
                          batch_size=1, eval_batch_size=1, eval_tokens=n_tokens,
                          eval_overrides=over)  # fmt: skip
            t0 = time.perf_counter()
            with torch.no_grad():
                bpc = task.evaluate(model, "valid")["bpc"]
            row = {"key": _key(rec["cell"], e), "cell": rec["cell"], "mechanism": rec["mechanism"],
                   "seed": rec["seed"], "train": {k: rec["overrides"].get(k) for k in
                                                  ("seq_len", "mem_len", "cmem_len")},
                   **e, "valid_bpc": bpc, "eval_tokens": n_tokens,
                   "eval_s": time.perf_counter() - t0}  # fmt: skip
            done[row["key"]] = row
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{row['key']}: {bpc:.4f} bpc ({row['eval_s']:.0f} s)", flush=True)
    _report(args.out, list(done.values()))
    return 0


def _report(out: Path, rows: list[dict[str, Any]]) -> None:
    """``memory_eval.md`` (a row per model, a column per factor) and ``memory_eval.png``."""
    if not rows:
        return
    factors = sorted({r["factor"] for r in rows})
    lines = [
        "| model (training memory) | " + " | ".join(f"{f:g}x" for f in factors) + " |",
        "|---|" + "---|" * len(factors),
    ]
    for cell in sorted({r["cell"] for r in rows}):
        mine = [r for r in rows if r["cell"] == cell]
        t = mine[0]["train"]
        mem = f"{t['mem_len']}" + (f" + {t['cmem_len']} compressed" if t.get("cmem_len") else "")
        cells = []
        for f in factors:
            plain = [r for r in mine if r["factor"] == f and r["clamp_len"] is None]
            clamp = [r for r in mine if r["factor"] == f and r["clamp_len"] is not None]
            txt = f"{plain[0]['valid_bpc']:.4f}" if plain else "-"
            if clamp:
                txt += f" (clamped {clamp[0]['valid_bpc']:.4f})"
            cells.append(txt)
        lines.append(f"| {mine[0]['mechanism']} s{mine[0]['seed']} (segment {t['seq_len']}, memory "
                     f"{mem}) | " + " | ".join(cells) + " |")  # fmt: skip
    n = rows[0]["eval_tokens"]
    where = "the whole split" if n is None else f"the first {n:,} characters of the split"
    lines += ["", f"Validation bpc on {where}, one stream, "
              "the trained weights unchanged; 'clamped': relative distances beyond the training "
              "context share one encoding (`clamp_len`)."]  # fmt: skip
    (out / "memory_eval.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for cell in sorted({r["cell"] for r in rows}):
        mine = [r for r in rows if r["cell"] == cell]
        label = f"{mine[0]['mechanism']} s{mine[0]['seed']}"
        for clamp, style in ((False, "-o"), (True, "--x")):
            pts = sorted(
                (r["factor"], r["valid_bpc"]) for r in mine if (r["clamp_len"] is not None) == clamp
            )
            if clamp:  # the clamped line starts from the unclamped 1x point
                pts = [(f, b) for f, b in sorted((r["factor"], r["valid_bpc"]) for r in mine
                                                 if r["factor"] == 1)] + pts  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), style,
                        label=label + (" (clamp_len = training context)" if clamp else ""))  # fmt: skip
    ax.set_xscale("symlog", base=2, linthresh=0.5)
    ax.set_xlabel("evaluation memory / training memory")
    ax.set_ylabel("validation bpc")
    ax.set_title("Longer memory at evaluation (weights unchanged)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "memory_eval.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
