"""HAT's latency predictor on HAT's released latency files (WMT'14 En-De space; Xeon E5-2640,
TITAN Xp, Raspberry Pi 4): test RMSE / MAPE of the MLP against a linear fit on the ten features,
a linear fit on HAT's Mult-Adds (the README's FLOPs / 2) and one on the Mult-Adds of the
measured decoding workload, per device and split seed; predicted-vs-measured plots.

The official predictor configuration (``configs/wmt14.en-de/latency_predictor/*.yml``): features
divided by [640, 6, 2048, 6, 640, 6, 2048, 6, 6, 2], latency by 300 / 200 / 5000 ms, MLP
10-400-400-400-400-1, MSE, Adam lr 1e-5, batch 128, 5000 steps; a seeded 8:1:1 split.

    python benchmarks/hat_predictor_released.py --seeds 0 1 2 --out runs/hat-predictor   # ~1 min/fit idle
    python benchmarks/hat_predictor_released.py --seeds 0 --steps 200 --out /tmp/hp      # smoke

Writes ``OUT/results.jsonl`` (environment, one record per device and seed) and
``OUT/<device>_seed<k>.png``.

The files are read from ``hat-latency/`` under the data folder: ``--data DIR``, else
``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (``--data`` may also name the
``hat-latency`` folder itself); without them the script stops at once with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from effiformer.bench.harness import environment
from effiformer.search.features import HAT_FEATURE_NORM, HAT_LATENCY_NORM
from effiformer.search.latency import read_latency_csv
from effiformer.search.plots import plot_predicted_vs_measured
from effiformer.search.predictor import compare_predictors, hat_proxies

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
FILES = {"xeon": "cpu_xeon", "titanxp": "gpu_titanxp", "raspberrypi": "cpu_raspberrypi"}


def _csv(device: str) -> str:
    return f"wmt14ende_{FILES[device]}_all.csv"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _data.add_data_flag(p, itself="the hat-latency folder")
    p.add_argument("--devices", nargs="+", default=list(FILES), choices=list(FILES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    files = [_csv(device) for device in args.devices]
    args.data = str(
        _data.require_dataset(
            __file__,
            args.data,
            "hat-latency",
            is_dataset=lambda path: all((path / f).is_file() for f in files),
            what=f"hat-latency ({', '.join(files)})",
        )
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        env = environment(torch.device("cpu"), "float32", 1, peak=False)
        f.write(json.dumps({"kind": "environment", **env, "argv": sys.argv[1:]}) + "\n")
        for device in args.devices:
            data = read_latency_csv(Path(args.data) / _csv(device))
            proxies = hat_proxies(data.features)
            for seed in args.seeds:
                t0 = time.monotonic()
                rep = compare_predictors(
                    data.features, data.latency_ms, proxies, feature_norm=HAT_FEATURE_NORM,
                    lat_norm=HAT_LATENCY_NORM[device], seed=seed, steps=args.steps,
                )  # fmt: skip
                r = rep.results
                rec = {
                    "kind": "predictor", "device": device, "seed": seed, "steps": args.steps,
                    "rows": len(data), "split": list(rep.sizes), "test": r,
                    "mlp_over_macs_rmse": r["mlp"]["rmse"] / r["macs_linear"]["rmse"],
                    "mlp_over_features_linear_rmse":
                        r["mlp"]["rmse"] / r["features_linear"]["rmse"],
                    "fit_s": time.monotonic() - t0,
                }  # fmt: skip
                f.write(json.dumps(rec) + "\n")
                f.flush()
                plot_predicted_vs_measured(
                    rep.test_true, rep.test_pred, out / f"{device}_seed{seed}.png",
                    title=f"HAT WMT'14 En-De, {device} (test split, seed {seed})",
                    baselines={"Mult-Adds linear": rep.baseline_pred["macs_linear"]},
                )  # fmt: skip
                print(
                    f"{device} seed {seed}: RMSE MLP {r['mlp']['rmse']:.2f} | features-linear "
                    f"{r['features_linear']['rmse']:.2f} | Mult-Adds-linear "
                    f"{r['macs_linear']['rmse']:.2f} | decoding-Mult-Adds-linear "
                    f"{r['decoding_macs_linear']['rmse']:.2f} ms "
                    f"(MAPE {r['mlp']['mape']:.1f} / {r['features_linear']['mape']:.1f} / "
                    f"{r['macs_linear']['mape']:.1f} / {r['decoding_macs_linear']['mape']:.1f} %)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
