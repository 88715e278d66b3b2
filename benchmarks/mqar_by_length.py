"""Score recorded MQAR quality cells at every length of their training ladder (64, 128, ...,
their own T), from their last checkpoint: does a row that stays near chance at 1,024 tokens
solve the short sequences it also trained on?

The question (docs/quality.md, issue 22): cells longer than 64 train on a ladder of lengths
(64, 128, ..., T, one length per step, the same tokens per step) and are scored at T only. A row
near chance at T that solves 64 has formed the recall circuit and fails to carry it to long
sequences (its positions, its reach); a row near chance everywhere has not formed it at all.

    python benchmarks/mqar_by_length.py --out benchmarks/results/quality_cpu_mqar \\
        --cells mqar/relative-xl/T1024/lr0.001/s0 mqar/dense/T1024/lr0.001/s0

Reads each cell's record in ``OUT/results.jsonl`` and its last checkpoint in ``OUT/cells/``;
writes ``OUT/by_length.jsonl`` (one row per cell: test accuracy per length, T/16 key-value pairs
at each, the test set of the cell's task built at that length; at T the suite's own) and
``OUT/by_length.md``; rows of cells not named keep what they held.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from effiformer.bench.quality import BUDGETS, _make_cell, recorded_cells
from effiformer.checkpoint import load_checkpoint
from effiformer.tasks.mqar import MQARTask, length_ladder

NAME = "mqar_by_length.py"


def by_length(model: torch.nn.Module, record: dict, lengths: list[int]) -> dict[str, float]:
    """Test accuracy of ``model`` on MQAR at each of ``lengths``: the cell's own task (its seed,
    batch and options: the evaluation set's size) built at that length, T/16 pairs. At the
    cell's own length this is the test set the suite scored."""
    cell = _make_cell(BUDGETS[record["budget"]], "mqar", record["mechanism"], record["length"],
                      record["lr"], record["seed"], None, data=None)  # fmt: skip
    opts = {k: v for k, v in (cell.get("task_options") or {}).items() if k != "train_min_len"}
    out = {}
    for length in lengths:
        task = MQARTask(seq_len=length, batch_size=int(record["batch"]), seed=int(record["seed"]),
                        **opts)  # fmt: skip
        out[str(length)] = task.evaluate(model, "test")["accuracy"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="the quality run's folder")
    p.add_argument("--cells", nargs="+", required=True, help="MQAR cell ids, as in results.jsonl")
    p.add_argument("--min-len", type=int, default=64, help="the ladder's shortest length")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    try:  # every cell is checked before anything is scored or written
        found = recorded_cells(out, args.cells)
    except ValueError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    todo = []
    for r, run in found:
        cell_id = r["cell"]
        if r["task"] != "mqar":
            print(f"{NAME}: {cell_id} is not an MQAR cell", file=sys.stderr)
            return 2
        try:
            lengths = list(length_ladder(args.min_len, int(r["length"])))
        except ValueError as e:
            print(f"{NAME}: {cell_id}: {e}", file=sys.stderr)
            return 2
        todo.append((r, run, lengths))
    path = out / "by_length.jsonl"
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[row["cell"]] = row
    for r, run, lengths in todo:
        model, _ = load_checkpoint(run)
        model.eval()
        step = (run / "latest").read_text().strip()
        row = {"cell": r["cell"], "mechanism": r["mechanism"], "checkpoint": step,
               "record_test": r.get("test"), "test": by_length(model, r, lengths)}  # fmt: skip
        rows[r["cell"]] = row
        print(r["cell"], {k: round(v, 3) for k, v in row["test"].items()}, flush=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows.values()))
    lengths = sorted({int(n) for row in rows.values() for n in row["test"]})
    lines = ["MQAR test accuracy of each trained cell at the lengths of its training ladder "
             "(T/16 key-value pairs at each; chance 1/128):", "",
             "| cell | " + " | ".join(f"T={n}" for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]  # fmt: skip
    for row in rows.values():
        cols = [row["test"].get(str(n)) for n in lengths]
        lines.append(f"| {row['cell']} | "
                     + " | ".join("-" if v is None else f"{100 * v:.1f}%" for v in cols) + " |")  # fmt: skip
    (out / "by_length.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
