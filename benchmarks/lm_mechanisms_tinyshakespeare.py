"""Every causal attention mechanism in the same decoder, on tinyshakespeare, under the same CPU time.

Each row is ``vanilla-small`` (d 256, 4 layers, 4 heads, T 256, byte level) with one attention
part swapped in by configuration (``--set attention.name=...``), plus the Reformer family's own
model; every row runs ``benchmarks/train_tinyshakespeare.py`` with the same budget, batch,
segment length, optimiser and schedule (its defaults: AdamW, lr 3e-3, warmup 50, cosine sized to
the budget, no dropout) and is scored on the whole validation split. The rows:

- ``dense``: causal SDPA (the baseline);
- ``sparse-strided`` / ``sparse-fixed``: Sparse Transformer patterns with l = 16 = sqrt(T) (fixed:
  c = 4, the paper's c/l = 1/4);
- ``adaptive-span``: spans learned up to S = 256 (the segment: no cache in this decoder);
- ``routing``: Routing attention (sqrt(T) = 16 clusters, the official default) with local
  windows of 64 on half the heads;
- ``lsh``: the dense model's attention replaced by LSH attention (chunks of 64, 2 hashes);
- ``reformer``: ``reformer-small`` (reversible layers, shared-QK LSH) at the same width.

Writes ``OUT/ROW/`` (each row's run), ``OUT/summary.jsonl`` and ``OUT/bpc.png``, and prints a
table of bpc, difference to the dense row, steps and tokens/s.

    python benchmarks/lm_mechanisms_tinyshakespeare.py --time-budget 300 --threads 1 --out OUT

The data folder: ``--data DIR``, else ``$EFFIFORMER_DATA``, else ``../shared/data`` beside the
checkout (``--data`` may also name ``input.txt`` itself); it must hold
``tinyshakespeare/input.txt``, checked before the first row (one line and exit status 2 if not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)
import train_tinyshakespeare  # noqa: E402  (the script beside this one)

ROWS: dict[str, tuple[str, list[str]]] = {
    "dense": ("vanilla-small", []),
    "sparse-strided": (
        "vanilla-small",
        ["attention.name=sparse", "attention.pattern=strided", "attention.stride=16"],
    ),
    "sparse-fixed": (
        "vanilla-small",
        [
            "attention.name=sparse",
            "attention.pattern=fixed",
            "attention.stride=16",
            "attention.summary=4",
        ],
    ),
    "adaptive-span": ("vanilla-small", ["attention.name=adaptive_span", "attention.max_span=256"]),
    "routing": ("vanilla-small", ["attention.name=routing", "attention.window=64"]),
    "lsh": (
        "vanilla-small",
        ["attention.name=lsh", "attention.chunk_len=64", "attention.n_hashes=2"],
    ),
    "reformer": ("reformer-small", []),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--time-budget", type=float, default=300.0, help="seconds per row")
    p.add_argument("--threads", default="1")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    _data.add_data_flag(p, itself="tinyshakespeare's input.txt")
    args = p.parse_args(argv)
    corpus = _data.require_dataset(
        __file__, args.data, train_tinyshakespeare.CORPUS_NAME, is_dataset=Path.is_file
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.jsonl"
    done = {}
    if summary.exists():
        done = {r["row"]: r for r in map(json.loads, summary.read_text().splitlines())}
    for row in args.rows:
        if row in done:
            continue
        model, sets = ROWS[row]
        if model == "reformer-small":
            sets = [*sets, f"seq_len={args.seq_len}"]
        run_out = out / row
        flags = [
            "--model", model, "--time-budget", str(args.time_budget), "--threads", args.threads,
            "--seq-len", str(args.seq_len), "--batch", str(args.batch), "--seed", str(args.seed),
            "--out", str(run_out), "--no-progress", "--data", str(corpus),
        ]  # fmt: skip
        for item in ["dropout=0.0", *sets]:
            flags += ["--set", item]
        print(f"== {row}: {model} {' '.join(sets)}", file=sys.stderr, flush=True)
        train_tinyshakespeare.main(flags)
        rec = [json.loads(x) for x in (run_out / "results.jsonl").read_text().splitlines()][-1]
        rec = {"row": row, "sets": sets, **rec}
        with open(summary, "a") as f:
            f.write(json.dumps(rec) + "\n")
        done[row] = rec
    rows = [done[r] for r in args.rows if r in done]
    base = done.get("dense")
    print("| row | val bpc | vs dense | steps | tokens/s | params |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        diff = f"{r['val_bpc'] - base['val_bpc']:+.3f}" if base else "-"
        print(
            f"| {r['row']} | {r['val_bpc']:.3f} | {diff} | {r['steps']} | "
            f"{r['tokens_per_s_median']:,.0f} | {r['params'] / 1e6:.2f} M |"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar([r["row"] for r in rows], [r["val_bpc"] for r in rows], color="tab:blue")
        if base:
            ax.axhline(base["val_bpc"] + 0.05, color="tab:red", ls="--", label="dense + 0.05")
            ax.legend()
        lo = min(r["val_bpc"] for r in rows)
        ax.set_ylim(lo - 0.2, max(r["val_bpc"] for r in rows) + 0.1)
        ax.set_ylabel("validation bpc")
        ax.set_title(f"tinyshakespeare, {args.time_budget:.0f} s CPU per row")
        plt.setp(ax.get_xticklabels(), rotation=20)
        fig.tight_layout()
        fig.savefig(out / "bpc.png", dpi=120)
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
