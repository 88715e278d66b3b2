"""A latency dataset of SubTransformers measured on this CPU (Multi30k space) and HAT's predictor
trained on it: test RMSE / MAPE against the linear baselines, and the predicted-vs-measured plot.

Samples come from the Multi30k *latency* space (the training space with FFN 256 and 1 head added,
HAT's rule at this scale); each is a standalone model (vocabulary 8000) timed as HAT times:
batch 1, a 30-token sentence, beam 5, 30 incremental decoder steps, 5 warm-up and 20 timed runs,
the 10-90 % trimmed mean, one thread (``--threads``). The dataset file is resumable: rerun the
same command after an interruption and it continues.

    python benchmarks/hat_latency_multi30k.py --n 300 --out runs/hat-lat        # ~1-2 s/row idle
    python benchmarks/hat_latency_multi30k.py --n 20 --runs 3 --warmup 1 --steps 300 \\
        --out /tmp/hat-lat                                                      # smoke

Writes ``OUT/multi30k_cpu.csv`` (+ ``.jsonl`` sidecar), ``OUT/predictor.pt``,
``OUT/predictor.json`` (the errors) and ``OUT/predicted_vs_measured.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effiformer.models.hat import latency_space
from effiformer.search.latency import LatencySettings, build_latency_dataset
from effiformer.search.plots import plot_predicted_vs_measured
from effiformer.search.workflow import train_predictor_from_csv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--space", default="multi30k")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=5000, help="predictor training steps")
    p.add_argument("--lr", type=float, default=1e-5, help="predictor learning rate")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = LatencySettings(
        vocab_size=args.vocab_size, src_len=args.src_len, runs=args.runs, warmup=args.warmup,
        threads=args.threads, seed=args.seed,
    )  # fmt: skip
    csv_path = out / f"{args.space}_cpu.csv"
    data = build_latency_dataset(csv_path, latency_space(args.space), args.n, settings)
    report, record = train_predictor_from_csv(
        csv_path, out / "predictor.pt", steps=args.steps, lr=args.lr, seed=args.seed
    )
    record["latency_ms"] = {
        "min": float(data.latency_ms.min()), "mean": float(data.latency_ms.mean()),
        "max": float(data.latency_ms.max()),
        "encoder_share": float((data.encoder_ms / data.latency_ms).mean()),
    }  # fmt: skip
    (out / "predictor.json").write_text(json.dumps(record, indent=2) + "\n")
    plot_predicted_vs_measured(
        report.test_true, report.test_pred, out / "predicted_vs_measured.png",
        title=f"{args.space} SubTransformers on this CPU (test split)",
        baselines={"Mult-Adds linear": report.baseline_pred["macs_linear"]},
    )  # fmt: skip
    r = report.results
    print(
        f"{len(data)} rows, {record['latency_ms']['min']:.1f}-{record['latency_ms']['max']:.1f} "
        f"ms; test RMSE: MLP {r['mlp']['rmse']:.2f}, features-linear "
        f"{r['features_linear']['rmse']:.2f}, Mult-Adds-linear {r['macs_linear']['rmse']:.2f}, "
        f"decoding-Mult-Adds-linear {r['decoding_macs_linear']['rmse']:.2f} ms; MAPE MLP "
        f"{r['mlp']['mape']:.1f} %"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
