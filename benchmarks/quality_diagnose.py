"""Why a quality-suite row is weak: MQAR accuracy of every trained cell split by what its last
layer can attend (``effiformer.bench.quality.mqar_breakdown``): queries whose pair's value lies
inside the last layer's pattern (``direct``) against those it can only reach through an earlier
layer (``indirect``), and by query-to-value distance.

Reads ``OUT/results.jsonl`` and the checkpoints the run left in ``OUT/cells/`` (the run keeps
each cell's last checkpoint), writes ``OUT/diagnostics.jsonl`` and prints a table.

    python benchmarks/quality_diagnose.py --out benchmarks/results/quality_cpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from effiformer.bench.quality import BUDGETS, mqar_breakdown
from effiformer.checkpoint import load_checkpoint
from effiformer.tasks.mqar import MQARTask


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="the quality run's folder")
    p.add_argument("--sequences", type=int, default=128, help="test sequences per cell")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    results = out / "results.jsonl"
    if not results.is_file():
        print(f"quality_diagnose.py: {results} does not exist", file=sys.stderr)
        return 2
    recs = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    rows = []
    for r in recs:
        if r["task"] != "mqar" or r.get("status") != "ok":
            continue
        run = out / "cells" / r["cell"].replace("/", "_")
        if not (run / "latest").exists():
            print(f"skip {r['cell']}: no checkpoint in {run}", file=sys.stderr)
            continue
        model, _ = load_checkpoint(run)
        # the cell's own test set (its budget's task options), the first --sequences of it
        opts = BUDGETS[r["budget"]].tasks["mqar"].options
        task = MQARTask(seq_len=r["length"], batch_size=r["batch"], seed=r["seed"], **opts)
        d = mqar_breakdown(model, task, sequences=args.sequences)
        rows.append({"cell": r["cell"], "mechanism": r["mechanism"], "length": r["length"], **d})
    with open(out / "diagnostics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    print("| cell | accuracy | direct share | direct acc. | indirect acc. | by distance |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        dist = ", ".join(f"{b}: {pct(v['accuracy'])}" for b, v in row["by_distance"].items())
        print(f"| {row['cell']} | {pct(row['accuracy'])} | {pct(row.get('direct_fraction'))} | "
              f"{pct(row.get('direct_accuracy'))} | {pct(row.get('indirect_accuracy'))} | "
              f"{dist} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
