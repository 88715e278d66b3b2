"""Why a quality-suite row is weak: MQAR accuracy of every trained cell split by what its last
layer can attend (``effiformer.bench.quality.mqar_breakdown``): queries whose pair's value lies
inside the last layer's pattern (``direct``) against those it can only reach through an earlier
layer (``indirect``), and by query-to-value distance. For Routing cells (MQAR and duplication):
how often a query and the position it needs (the pair's value; the copy source half a sequence
back) fall in the same k-means cluster of a routing head (``colocated``), against the rate of
clusters drawn at random (w / T).

Reads ``OUT/results.jsonl`` (the last record of each cell) and the checkpoints the run left in
``OUT/cells/`` (the run keeps each cell's last checkpoint), writes ``OUT/diagnostics.jsonl`` and
``OUT/diagnostics.md`` (and prints the tables). Rows of cells measured before whose checkpoint
is gone since (a folder's cells are not all kept) stay as they were; a cell measured again
replaces its rows.

    python benchmarks/quality_diagnose.py --out benchmarks/results/quality_cpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import effiformer.attention.routing as routing_module
from effiformer.bench.quality import BUDGETS, _read_results, mqar_breakdown
from effiformer.checkpoint import load_checkpoint
from effiformer.tasks.duplication import DuplicationTask
from effiformer.tasks.mqar import MQARTask, mqar_recall_positions


@torch.no_grad()
def routing_colocation(model, x, needs):
    """Per routing call (layer) and head: the fraction of (query, needed position) pairs that
    share a cluster, and w / T. ``needs``: per row, a list of (query position, needed position)."""
    calls = []
    original = routing_module.route

    def spy(scores, window, real=None):
        idx = original(scores, window, real)
        calls.append(idx)
        return idx

    routing_module.route = spy
    try:
        model.eval()
        model(x)
    finally:
        routing_module.route = original
    out = []
    for layer, idx in enumerate(calls):  # (B, H, K, w)
        b, h, k, w = idx.shape
        for head in range(h):
            hit = total = 0
            for row in range(b):
                member = torch.zeros(k, x.shape[1], dtype=torch.bool)
                member.scatter_(1, idx[row, head], True)
                for q, src in needs[row]:
                    hit += bool((member[:, q] & member[:, src]).any())
                    total += 1
            out.append({"call": layer, "head": head, "colocated": hit / total,
                        "random": w / x.shape[1]})  # fmt: skip
    return out


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
    recs = list(_read_results(results).values())
    rows = []
    for r in recs:
        if (
            r["mechanism"].startswith("routing")
            and r["task"] in ("mqar", "duplication")
            and (out / "cells" / r["cell"].replace("/", "_") / "latest").exists()
        ):
            model, _ = load_checkpoint(out / "cells" / r["cell"].replace("/", "_"))
            opts = BUDGETS[r["budget"]].tasks[r["task"]].options
            if r["task"] == "mqar":
                task = MQARTask(seq_len=r["length"], batch_size=r["batch"], seed=r["seed"], **opts)
                x, y = task.split("test")
                x, y = x[:16], y[:16]
                needs = mqar_recall_positions(x, y, task.n_pairs)
            else:
                task = DuplicationTask(seq_len=r["length"], batch_size=r["batch"], seed=r["seed"],
                                       **opts)  # fmt: skip
                x, _ = task.split("test")
                x = x[:16]
                half = r["length"] // 2
                needs = [[(q, q - half + 1) for q in range(half, x.shape[1])]] * x.shape[0]
            coloc = routing_colocation(model, x, needs)
            rows.append({"cell": r["cell"], "mechanism": r["mechanism"], "length": r["length"],
                         "routing_colocation": coloc})  # fmt: skip
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
    path = out / "diagnostics.jsonl"
    measured = {row["cell"] for row in rows}
    kept = []
    if path.is_file():  # earlier rows of cells not measured now (their checkpoint may be gone)
        kept = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        kept = [row for row in kept if row["cell"] not in measured]
    rows = kept + rows
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    lines = ["| cell | accuracy | direct share | direct acc. | indirect acc. | by distance |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        if "routing_colocation" in row:
            continue
        dist = ", ".join(f"{b}: {pct(v['accuracy'])}" for b, v in row["by_distance"].items())
        lines.append(f"| {row['cell']} | {pct(row['accuracy'])} | "
                     f"{pct(row.get('direct_fraction'))} | {pct(row.get('direct_accuracy'))} | "
                     f"{pct(row.get('indirect_accuracy'))} | {dist} |")  # fmt: skip
    coloc = [row for row in rows if "routing_colocation" in row]
    if coloc:
        lines += ["", "| routing cell | layer | head | query and needed position in one cluster "
                  "| random |", "|---|---|---|---|---|"]  # fmt: skip
        for row in coloc:
            for c in row["routing_colocation"]:
                lines.append(f"| {row['cell']} | {c['call']} | {c['head']} | "
                             f"{pct(c['colocated'])} | {pct(c['random'])} |")  # fmt: skip
    (out / "diagnostics.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
