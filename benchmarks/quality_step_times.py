"""Quiet-machine step times of the quality suite's LM cells, and the LM curves against estimated
quiet seconds (step x that step time) instead of the seconds the cells logged while sharing the
cores.

    # on a quiet machine: one process, one thread, the cells' own shapes and models
    python benchmarks/quality_step_times.py time --task lm-ptb --length 1024 \\
        --out benchmarks/results/quality_cpu_lm/step_times_quiet.json
    python benchmarks/quality_step_times.py plot --results benchmarks/results/quality_cpu_lm \\
        --times benchmarks/results/quality_cpu_lm/step_times_quiet.json

``time`` builds each mechanism's cell (the CPU budget's model, batch and segments), runs 8 training
steps of forward, backward and an AdamW step on random windows of the corpus, and records the
median of the last 6 with the load average (the harness's ``--equal-time`` timing does the same
through the trainer). ``plot`` writes ``lm_quiet_time.png`` beside the results.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)
from effiformer.bench.mechanisms import MECHANISMS  # noqa: E402
from effiformer.bench.quality import BUDGETS, LM_DATA, TASKS, _make_cell, _task_setup  # noqa: E402

LM_ROWS = [m for m, mech in MECHANISMS.items() if mech.default and "lm" in mech.kinds]


def time_cells(task: str, length: int, mechanisms: list[str], data: str) -> dict:
    torch.set_num_threads(1)
    out = {}
    for m in mechanisms:
        cell = _make_cell(BUDGETS["cpu"], task, m, length, 3e-3, 0, None, data=data)
        lm, model = _task_setup(cell)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        init = getattr(model, "init_state", None)
        state = init(cell["batch"]) if init is not None else None
        corpus, seg = lm.corpus.train, lm.seq_len
        gen = torch.Generator().manual_seed(0)
        times = []
        for _ in range(8):
            starts = torch.randint(0, corpus.numel() - seg - 1, (cell["batch"],), generator=gen)
            x = torch.stack([corpus[i : i + seg] for i in starts])
            y = torch.stack([corpus[i + 1 : i + seg + 1] for i in starts])
            t0 = time.perf_counter()
            res = model(x, targets=y, state=state) if state is not None else model(x, targets=y)
            if state is not None:
                state = torch.utils._pytree.tree_map(
                    lambda t: t.detach() if isinstance(t, torch.Tensor) else t, res.state
                )
            res.loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        out[m] = {
            "step_s": statistics.median(times[2:]),
            "batch": cell["batch"],
            "segment": seg,
            "loadavg": list(os.getloadavg()),
        }
        print(f"{m:16s} {out[m]['step_s'] * 1e3:7.1f} ms", flush=True)
    return out


def plot(results: Path, times: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("status") == "ok" and TASKS[r["task"]][0] == "lm"]
    order = list(MECHANISMS)
    recs.sort(key=lambda r: order.index(r["mechanism"]))  # the quality plots' colour order
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in recs:
        if r["mechanism"] not in times or r["phase"] != "main" or r["seed"] != 0:
            continue
        step_s = times[r["mechanism"]]["step_s"]
        steps = [c[0] for c in r["curve"]]
        ax.plot([s * step_s / 60 for s in steps], [c[2] for c in r["curve"]], label=r["mechanism"])
    ax.set_xlabel("estimated quiet minutes of one core (step x quiet step time)")
    ax.set_ylabel(f"{recs[0]['task']}: validation bpc")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = results / "lm_quiet_time.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--task", default="lm-ptb", choices=sorted(LM_DATA))
    t.add_argument("--length", type=int, default=1024)
    t.add_argument("--mechanisms", nargs="+", default=LM_ROWS)
    t.add_argument("--out", required=True)
    _data.add_data_flag(t)
    g = sub.add_parser("plot")
    g.add_argument("--results", required=True)
    g.add_argument("--times", required=True)
    args = p.parse_args(argv)
    if args.cmd == "time":
        root = _data.require(__file__, args.data, LM_DATA[args.task][0])
        table = time_cells(args.task, args.length, args.mechanisms, str(root))
        Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
        return 0
    print(plot(Path(args.results), json.loads(Path(args.times).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
