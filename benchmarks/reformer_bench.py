"""The Reformer's speed and memory targets, measured by the ``effiformer bench`` harness in one run.

1. One LSH attention layer (``reformer-small``: d 256, 4 heads of 64, chunk 64, 4 hashes, causal)
   forward+backward against causal dense SDPA of the same shape (the ``sdpa`` row) and against
   ``reformer-pytorch`` (lucidrains, ``LSHSelfAttention`` with bucket_size 64 and 4 hashes) and
   HF transformers' ``ReformerAttention`` (LSH) at the same settings, at ``--lengths``
   (default 4096, 8192, 16384). Targets: >= 3x faster than SDPA at 16,384; >= 1.5x faster than
   reformer-pytorch and <= half its peak memory at every length.
2. The whole ``reformer-small`` model (reversible) with 2 and with 12 layers at ``--model-length``
   (default 4096): the 12-layer peak within 1.3x of the 2-layer one. The cells run with glibc's
   mmap threshold pinned (``MALLOC_MMAP_THRESHOLD_``, ``--mmap-threshold``, 0 = the default
   allocator): with its default *dynamic* threshold, freed blocks stay in the heap and the
   process's high-water mark grows with the number of alloc/free cycles, i.e. with depth, although
   nothing more is held (saved-tensor bytes grow only by the replayed buckets; see
   ``tests/layers/test_reversible.py``). Both are recorded when ``--mmap-threshold`` is set.

Reference rows come from the plugin :mod:`effiformer.bench.reformer_references` (needs
``pip install reformer-pytorch`` and ``transformers``; a missing package skips its row). Writes
the harness's records to ``OUT/attention`` and ``OUT/model-L{2,12}``, and a summary with the
ratios to ``OUT/summary.jsonl``. Timing on a shared machine is noisy: compare the ratios, which
come from cells of the same run.

    python benchmarks/reformer_bench.py                               # full (~15 min on 2 cores)
    python benchmarks/reformer_bench.py --lengths 2048 --model-length 2048 --repeats 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from effiformer.bench import run_bench

PLUGIN = "effiformer.bench.reformer_references"


def _by(records, name, length, key):
    for r in records:
        if r["name"] == name and r["seq_len"] == length and r["status"] == "ok":
            return r[key]
    return None


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--model-length", type=int, default=4096)
    p.add_argument("--mmap-threshold", type=int, default=131072)
    p.add_argument("--repeats", type=int, default=3)
    # The harness estimates memory as if attention scores were materialised (B·H·T² per layer),
    # which would skip the 12-layer LSH model; LSH never builds them, so lift the limit.
    p.add_argument("--max-memory-mib", type=float, default=1e6)
    p.add_argument("--only", choices=["attention", "model"], default=None, help="one half only")
    p.add_argument("--out", default="runs/reformer_bench")
    args = p.parse_args(argv)
    out = Path(args.out)
    common = dict(
        repeats=args.repeats, warmup=1, progress=False, plot=False,
        max_memory_mib=args.max_memory_mib, plugins=[PLUGIN],
    )  # fmt: skip
    att = []
    if args.only != "model":
        att = run_bench(
            ["reformer-small"], lengths=args.lengths, parts=("attention",), out=out / "attention",
            refs=["sdpa", "reformer-pytorch", "hf-reformer-lsh"], **common,
        ).records  # fmt: skip
    thresholds = [None] + ([args.mmap_threshold] if args.mmap_threshold else [])
    models_by = {}
    for thr in thresholds if args.only != "attention" else ():
        old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
        if thr is not None:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = str(thr)  # inherited by the cell processes
        try:
            models_by[thr] = {
                n: run_bench(
                    ["reformer-small"], lengths=[args.model_length], parts=("model",),
                    overrides=[f"n_layers={n}"], refs=["none"],
                    out=out / f"model-L{n}" / ("default-malloc" if thr is None else f"mmap-{thr}"),
                    **common,
                ).records
                for n in (2, 12)
            }  # fmt: skip
        finally:
            if old is None:
                os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
            else:
                os.environ["MALLOC_MMAP_THRESHOLD_"] = old
    summary = {"kind": "summary", "benchmark": "reformer_bench", "attention": [], "model": {}}
    for t in args.lengths:
        ours = _by(att, "reformer-small", t, "fwd_bwd_ms")
        row = {
            "seq_len": t,
            "lsh_fwd_bwd_ms": ours,
            "sdpa_over_lsh": _ratio(_by(att, "sdpa", t, "fwd_bwd_ms"), ours),
            "reformer_pytorch_over_lsh": _ratio(
                _by(att, "reformer-pytorch", t, "fwd_bwd_ms"), ours
            ),
            "hf_over_lsh": _ratio(_by(att, "hf-reformer-lsh", t, "fwd_bwd_ms"), ours),
            "lsh_peak_mib": _by(att, "reformer-small", t, "peak_mib"),
            "reformer_pytorch_peak_mib": _by(att, "reformer-pytorch", t, "peak_mib"),
            "hf_peak_mib": _by(att, "hf-reformer-lsh", t, "peak_mib"),
        }
        row["lsh_peak_over_reformer_pytorch"] = _ratio(
            row["lsh_peak_mib"], row["reformer_pytorch_peak_mib"]
        )
        summary["attention"].append(row)
    summary["model"] = []
    for thr, models in models_by.items():
        peaks = {n: _by(models[n], "reformer-small", args.model_length, "peak_mib") for n in models}
        summary["model"].append({
            "seq_len": args.model_length,
            "malloc_mmap_threshold": thr,
            "peak_mib_2_layers": peaks[2],
            "peak_mib_12_layers": peaks[12],
            "ratio_12_over_2": _ratio(peaks[12], peaks[2]),
        })  # fmt: skip
    with open(out / "summary.jsonl", "a") as f:
        f.write(json.dumps(summary) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
