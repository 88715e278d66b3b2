"""Training loss of one MQAR cell trained on the length ladder, one line per ladder length,
against the optimizer step: where the recall circuit forms (the short lengths leave their
plateau first) and how it reaches the long ones.

    python benchmarks/quality_ladder_plot.py \\
        benchmarks/results/quality_cpu_mqar/cells/mqar_dense_T1024_lr0.001_s0 \\
        --min-len 64 --out benchmarks/results/quality_cpu_mqar/dense_T1024_ladder.png

Step ``i`` (1-based) trained at the ladder's ``(i - 1) mod n``-th length (``MQARTask.batch``);
the curve is the mean loss over windows of ``--window`` steps at each length. Validation
accuracy (at the cell's own length) is drawn on a second axis.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cells", nargs="+", help="cell run folders (metrics.jsonl inside)")
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--window", type=int, default=100, help="steps per point at each length")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax2 = ax.twinx()
    for cell in args.cells:
        recs = [json.loads(x) for x in (Path(cell) / "metrics.jsonl").read_text().splitlines()]
        name = Path(cell).name
        top = int(name.split("_T")[1].split("_")[0])
        ladder, t = [], args.min_len
        while t <= top:
            ladder.append(t)
            t *= 2
        train = [r for r in recs if "lr" in r and "loss" in r]
        for i, length in enumerate(ladder):
            pts = [(r["step"], r["loss"]) for r in train if (r["step"] - 1) % len(ladder) == i]
            xs, ys = [], []
            for j in range(0, len(pts), args.window):
                chunk = pts[j : j + args.window]
                xs.append(chunk[-1][0])
                ys.append(sum(v for _, v in chunk) / len(chunk))
            ax.plot(xs, ys, label=f"train loss at {length} tokens")
        val = [(r["step"], r["val_accuracy"]) for r in recs if "val_accuracy" in r]
        ax2.plot([s for s, _ in val], [100 * a for _, a in val], "k--",
                 label=f"validation accuracy at {top} tokens")  # fmt: skip
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats per query)")
    ax2.set_ylabel("validation accuracy (%)")
    ax2.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="center right")
    ax.set_title("MQAR on the length ladder: " + ", ".join(Path(c).name for c in args.cells))
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
