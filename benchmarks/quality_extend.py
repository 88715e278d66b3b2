"""Continue one finished quality cell for more steps, in a folder of its own (the table's cell
and record stay as the budget made them): the evidence for "this mechanism gets there with more
steps" without changing the budget every other cell was measured with.

    python benchmarks/quality_extend.py --from benchmarks/results/quality_cpu_mqar \\
        --cell mqar/dense/T1024/lr0.001/s0 --steps 32000 \\
        --out benchmarks/results/quality_cpu_mqar_dense1024_long

The cell's checkpoint is copied to OUT/cell and trained on to ``--steps`` with the same recipe,
data order and target stop (resumable: rerun the same command); OUT/results.jsonl gets the
record, with the validation curve from step 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from effiformer.bench.quality import BUDGETS, LM_DATA, _make_cell, run_quality_cell

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="src", required=True, help="the quality run's --out folder")
    p.add_argument("--cell", required=True, help="cell id, e.g. mqar/dense/T1024/lr0.001/s0")
    p.add_argument("--steps", type=int, required=True, help="train the cell on to this step")
    p.add_argument("--out", required=True)
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    task = args.cell.split("/")[0]
    data = None
    if task in LM_DATA:  # an LM cell reads its corpus: checked before anything else
        data = str(_data.require(__file__, args.data, LM_DATA[task][0]))
    src, out = Path(args.src), Path(args.out)
    manifest = json.loads((src / "quality.json").read_text())
    budget = BUDGETS[manifest["budget"]["name"]]
    task, mech, length, lr, seed = args.cell.split("/")
    cell = _make_cell(budget, task, mech, int(length[1:]), float(lr[2:]), int(seed[1:]),
                      args.steps, data=data, out=None)  # fmt: skip
    run_dir = out / "cell"
    if not (run_dir / "latest").exists():
        shutil.copytree(src / "cells" / args.cell.replace("/", "_"), run_dir, dirs_exist_ok=True)
    cell["run_dir"] = str(run_dir)
    cell["extended_from"] = str(src)
    rec = {**cell, **run_quality_cell(cell)}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    print(f"{args.cell} to step {rec.get('steps_done')}: valid {rec.get('valid')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
