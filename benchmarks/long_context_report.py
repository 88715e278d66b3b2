"""The long-context table at equal compute (issue 25) from a quality run's records.

Reads ``OUT/results.jsonl`` and ``OUT/timing.json`` of a run made with ``--equal-time`` (for
example ``benchmarks/long_context_cpu.sh``) and writes ``OUT/equal_compute.md``: per mechanism
the quiet step time, the steps that fit the budget, validation bpc along the way (the curve's
prefix) and on the whole split at the end (mean and half-range over seeds), and the difference
from dense attention; and ``OUT/equal_compute.png``: validation bpc against estimated quiet
minutes, one line per mechanism and seed.

    python benchmarks/long_context_report.py --out benchmarks/results/long_context_cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _records(out: Path) -> list[dict[str, Any]]:
    from effiformer.bench.quality import RESULTS, _read_results

    return [r for r in _read_results(out / RESULTS).values() if r.get("status") == "ok"]


def _fmt(vals: list[float]) -> str:
    if not vals:
        return "-"
    mean = statistics.fmean(vals)
    if len(vals) == 1:
        return f"{mean:.3f} (1)"
    return f"{mean:.3f} ± {(max(vals) - min(vals)) / 2:.3f} ({len(vals)})"


def report(out: Path) -> str:
    recs = _records(out)
    if not recs:
        raise SystemExit(f"no finished cell in {out}")
    timing = (
        json.loads((out / "timing.json").read_text()) if (out / "timing.json").is_file() else {}
    )
    by_mech: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in recs:
        by_mech.setdefault((r["task"], r["mechanism"]), []).append(r)
    lines = []
    for task in sorted({t for t, _ in by_mech}):
        dense = [r["valid"] for r in by_mech.get((task, "dense"), [])]
        d0 = statistics.fmean(dense) if dense else None
        rows = []
        for (t, m), rs in by_mech.items():
            if t != task:
                continue
            rs = sorted(rs, key=lambda r: r["seed"])
            length = rs[0]["length"]
            tkey = f"{task}/{m}/T{length}"
            step_s = (timing.get(tkey) or {}).get("step_s")
            valid = [r["valid"] for r in rs]
            test = [r["test"] for r in rs if "test" in r]
            quarter = []
            for frac in (0.25, 0.5, 1.0):
                pts = [c for c in rs[0]["curve"] if c[0] <= frac * rs[0]["steps"] + 1e-9]
                quarter.append(f"{pts[-1][2]:.2f}" if pts else "-")
            diff = statistics.fmean(valid) - d0 if d0 is not None else None
            rows.append((statistics.fmean(valid), m, rs[0], step_s, valid, test, quarter, diff))
        rows.sort()
        lines += [
            f"### {task} at T = {rows[0][2]['length']:,}, equal compute "
            f"({rows[0][2]['equal_time']['seconds']:g} s of quiet one-thread time per model)",
            "",
            "| mechanism | quiet step (s) | steps | params | valid bpc, whole split | test bpc "
            "| vs dense (valid) | curve: 1/4, 1/2, end of the budget (valid prefix) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for _, m, r, step_s, valid, test, quarter, diff in rows:
            d = "-" if diff is None or m == "dense" else f"{diff:+.3f}"
            st = f"{step_s:.3g}" if step_s else "-"
            lines.append(
                f"| {m} | {st} | {r['steps']:,} | {r['params'] / 1e6:.2f} M | {_fmt(valid)} | "
                f"{_fmt(test)} | {d} | {' / '.join(quarter)} |"
            )
        lines.append("")
    text = "\n".join(lines)
    (out / "equal_compute.md").write_text(text + "\n")
    _plot(out, recs)
    return text


def _plot(out: Path, recs: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    tasks = sorted({r["task"] for r in recs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        mechs = sorted({r["mechanism"] for r in recs if r["task"] == task})
        colours = {m: f"C{i % 10}" for i, m in enumerate(mechs)}
        for r in sorted(recs, key=lambda r: (r["mechanism"], r["seed"])):
            if r["task"] != task:
                continue
            quiet = (r.get("equal_time") or {}).get("step_s_quiet")
            if not quiet:
                continue
            xs = [c[0] * quiet / 60 for c in r["curve"]]
            ys = [c[2] for c in r["curve"]]
            ax.plot(xs, ys, color=colours[r["mechanism"]], ls="-" if r["seed"] == 0 else "--",
                    label=r["mechanism"] if r["seed"] == 0 else None)  # fmt: skip
        ax.set_xlabel("estimated quiet minutes of one core (step x step time measured alone)")
        ax.set_ylabel("validation bpc (first 65,536 characters)")
        ax.set_title(f"{task}: equal compute at T = {recs[0]['length']:,} (dashed: seed 1)")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "equal_compute.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the quality run's folder")
    args = p.parse_args(argv)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
