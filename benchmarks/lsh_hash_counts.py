"""Score recorded LSH quality cells again with 1, 2, 4 and 8 hashes and with full attention, from
their last checkpoint: the same scoring the suite now does for every LSH cell when it finishes,
for cells recorded before it did (MQAR and ListOps cells were scored with their 2 hashes only).

The question it answers (docs/quality.md, issue 22): LSH ends below dense on MQAR at 1,024
tokens. If the trained weights score near dense once every key is visible (``full``) or with
more hashes, hashing caps what the model can retrieve (keys and queries land in different
buckets); if they score the same, the model itself learned less (slower, not capped).

    python benchmarks/lsh_hash_counts.py --out benchmarks/results/quality_cpu_mqar \\
        --cells mqar/lsh/T1024/lr0.001/s0

Reads each cell's record in ``OUT/results.jsonl`` and its last checkpoint in ``OUT/cells/``;
appends the record again with ``hash_evals`` (and ``hash_evals_from``: this script, the
checkpoint's step, the test score of the reloaded model with its own 2 hashes) to
``OUT/results.jsonl`` (the last record of a cell is the one the table reads; the harness
appends the same way) and writes the table again. ``--data`` is needed for LM cells only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from effiformer.bench.quality import (
    BUDGETS,
    TASKS,
    _hash_evals,
    _make_cell,
    _read_results,
    _report,
    _task_setup,
    recorded_cells,
)
from effiformer.checkpoint import load_checkpoint

NAME = "lsh_hash_counts.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="the quality run's folder")
    p.add_argument("--cells", nargs="+", required=True, help="LSH cell ids, as in results.jsonl")
    p.add_argument("--data", default=None, help="folder holding ptb/ and tinyshakespeare/ (LM)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    try:  # every cell is checked before anything is scored or written
        todo = recorded_cells(out, args.cells)
    except ValueError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    for r, _ in todo:
        cell_id = r["cell"]
        if r["mechanism"] != "lsh":
            print(f"{NAME}: {cell_id} is not an LSH cell (mechanism {r['mechanism']!r})",
                  file=sys.stderr)  # fmt: skip
            return 2
        if TASKS[r["task"]][0] == "bidirectional":
            print(f"{NAME}: {cell_id}: {r['task']} is a classification task (its classifier "
                  "wraps the model); hash counts are scored on the causal tasks", file=sys.stderr)  # fmt: skip
            return 2
        if r.get("status") != "ok":
            print(f"{NAME}: {cell_id} did not finish ({r.get('status')})", file=sys.stderr)
            return 2
        if TASKS[r["task"]][0] == "lm" and args.data is None:
            print(f"{NAME}: {cell_id} is a language-modelling cell: --data is needed",
                  file=sys.stderr)  # fmt: skip
            return 2
    lines = ["| cell | recorded test | reloaded, 2 hashes | 1 hash | 2 | 4 | 8 | full |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r, run in todo:
        cell = _make_cell(BUDGETS[r["budget"]], r["task"], r["mechanism"], r["length"], r["lr"],
                          r["seed"], None, data=args.data)  # fmt: skip
        task, _ = _task_setup(cell)
        model, _ = load_checkpoint(run)
        model.eval()
        metric = TASKS[r["task"]][1]
        again = task.evaluate(model, "test")[metric]
        hashes = _hash_evals(model, task, int(r["length"]), metric)
        step = (run / "latest").read_text().strip()
        new = {**r, "hash_evals": hashes,
               "hash_evals_from": {"script": f"benchmarks/{NAME}", "checkpoint": step,
                                   "test_reloaded": again}}  # fmt: skip
        with open(out / "results.jsonl", "a") as f:  # one line, one write: as the harness does
            f.write(json.dumps(new) + "\n")
        bpc = metric == "bpc"

        def fmt(v: float, bpc: bool = bpc) -> str:
            return f"{v:.3f}" if bpc else f"{100 * v:.1f}%"

        lines.append(f"| {r['cell']} | {fmt(r['test'])} | {fmt(again)} | "
                     + " | ".join(fmt(hashes[k]) for k in
                                  ("hashes_1", "hashes_2", "hashes_4", "hashes_8", "full"))
                     + " |")  # fmt: skip
        print(lines[-1], flush=True)
    _report(out, _read_results(out / "results.jsonl"), False)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
