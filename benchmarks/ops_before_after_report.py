"""The table of ``benchmarks/ops_before_after.sh``: every workload's median step time before and
after (median over the rounds), and after / before. The dense SDPA rows the benchmarks time in
the same runs are the control: the library did not change them, so their ratio is the machine's
drift between the two sides.

    python benchmarks/ops_before_after_report.py --out benchmarks/results/ops_before_after
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def _rows(out: Path) -> dict[tuple[str, int], dict[str, list[float]]]:
    times: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for side in ("before", "after"):
        for f in sorted(out.glob(f"sparse_speed_{side}_r*.jsonl")):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                times[(f"sparse_speed {r['name']}", r["seq_len"])][side].append(r["wall_ms_median"])
        for f in sorted(out.glob(f"routing_bench_{side}_r*.jsonl")):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                if "fwd_bwd_ms" in r:
                    key = (f"routing_bench {r.get('workload', '?')}", r["seq_len"])
                    times[key][side].append(r["fwd_bwd_ms"])
        for f in sorted(out.glob(f"reformer_bench_{side}_r*/summary.jsonl")):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                for a in r.get("attention", []):
                    times[("reformer_bench lsh", a["seq_len"])][side].append(a["lsh_fwd_bwd_ms"])
                    if a.get("sdpa_over_lsh"):
                        sdpa = a["lsh_fwd_bwd_ms"] * a["sdpa_over_lsh"]
                        times[("reformer_bench sdpa", a["seq_len"])][side].append(sdpa)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/ops_before_after")
    args = p.parse_args(argv)
    out = Path(args.out)
    rows = _rows(out)
    commits = (out / "commits.txt").read_text().strip() if (out / "commits.txt").is_file() else ""
    lines = [
        f"Before / after the ops floor ({commits}); median over rounds of each benchmark's own "
        "median, ms (forward + backward of one layer).",
        "",
        "| workload | T | before (ms) | after (ms) | after / before |",
        "|---|---|---|---|---|",
    ]
    for (name, t), sides in sorted(rows.items()):
        if not sides.get("before") or not sides.get("after"):
            continue
        b, a = statistics.median(sides["before"]), statistics.median(sides["after"])
        lines.append(f"| {name} | {t:,} | {b:.1f} | {a:.1f} | {a / b:.3f} |")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
