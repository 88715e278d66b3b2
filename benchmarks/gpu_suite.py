"""One prepared command for a lent GPU: at most about 8 minutes on one H200, in three stages.

    python benchmarks/gpu_suite.py --out benchmarks/results/gpu_suite_h200     # on the device
    python benchmarks/gpu_suite.py --tiny --device cpu --skip-tests --out OUT   # the suite's smoke

1. ``tests``: ``pytest -m gpu -q`` (the GPU tests of the default suite's files), its summary line.
2. ``layers``: every mechanism of the default benchmark set (dense through SDPA, local, sparse
   fixed, routing, LSH, adaptive span, each at the quality suite's settings for the length) as one
   attention layer, forward and backward, in bf16 at 4,096, 16,384 and 65,536 tokens, against the
   dense row (``effiformer.bench.run_bench`` on the default set's rows; memory by the device's
   peak statistics); a cell that runs out of time or memory is recorded as skipped.
3. ``quality``: the quality suite's ``gpu`` budget (MQAR and PTB characters at 4k-16k tokens, bf16,
   four cells at a time), needing the data folder (``--data``, else ``$EFFIFORMER_DATA``, else
   ``../shared/data``), checked before anything runs.

Every stage starts only while time is left (``--budget-s``, default 480) and is recorded with its
wall time and status in ``OUT/suite.json``; ``OUT/README.md`` holds the summary table and each
stage's own outputs sit in ``OUT/<stage>/``. ``--tiny``: the same stages at toy sizes (256 tokens,
float32, the ``smoke`` quality budget on MQAR with two mechanisms) so the test suite can run the
script on a CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)


def _tests(out: Path, deadline: float) -> dict:
    left = max(30.0, deadline - time.monotonic())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=left,
    )
    (out / "pytest.txt").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = lines[-1] if lines else "(no output)"
    # 5: nothing collected (no GPU test in the selection) is not a failure of the suite
    ok = proc.returncode in (0, 5)
    return {"status": "ok" if ok else "failed", "summary": summary}


def _layers(out: Path, device: str, tiny: bool, deadline: float) -> dict:
    from effiformer.bench import run_bench

    lengths = (256,) if tiny else (4096, 16384, 65536)
    left = max(10.0, deadline - time.monotonic())
    result = run_bench(
        (),
        lengths=lengths,
        parts=("attention",),
        device=device,
        dtype="float32" if tiny else "bfloat16",
        repeats=1 if tiny else 3,
        warmup=0 if tiny else 1,
        out=out,
        force=True,
        plot=False,
        progress=False,
        cell_timeout=min(left, 30.0 if tiny else 90.0),
    )
    rows = [r for r in result.records if r.get("part") == "attention"]
    done = [r for r in rows if r.get("status") == "ok"]
    return {
        "status": "ok" if done else "failed",
        "summary": f"{len(done)} of {len(rows)} layer cells measured at {list(lengths)} tokens",
    }


def _quality(out: Path, device: str, tiny: bool, data: str | None, deadline: float) -> dict:
    from effiformer.bench.quality import run_quality

    if tiny:
        kw = dict(tasks=["mqar"], mechanisms=["dense", "local"], budget="smoke", jobs=1)
    else:
        kw = dict(tasks=None, mechanisms=None, budget="gpu")
    if device == "cpu" and not tiny:
        raise SystemExit("the gpu quality budget needs --device cuda (or --tiny)")
    left = max(10.0, deadline - time.monotonic())
    recs = run_quality(
        kw["tasks"], kw["mechanisms"], budget=kw["budget"], out=out, data=data,
        jobs=kw.get("jobs"), plot=False, progress=False, cell_timeout=left,
    )  # fmt: skip
    ok = [r for r in recs if r.get("status") == "ok"]
    return {
        "status": "ok" if ok else "failed",
        "summary": f"{len(ok)} of {len(recs)} quality cells finished ({kw['budget']} budget)",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="toy sizes: a smoke run of the script")
    p.add_argument("--skip-tests", action="store_true", help="leave out the pytest stage")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget (s)")
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    data = None
    if not args.tiny:  # the gpu budget's PTB cells read the corpus: checked first
        data = str(_data.require(__file__, args.data, "ptb"))
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_suite: no CUDA device here; use --tiny --device cpu", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.budget_s
    stages = [
        ("tests", lambda d: _tests(d, deadline)),
        ("layers", lambda d: _layers(d, args.device, args.tiny, deadline)),
        ("quality", lambda d: _quality(d, args.device, args.tiny, data, deadline)),
    ]
    if args.skip_tests:
        stages = stages[1:]
    report: dict = {"device": args.device, "tiny": args.tiny, "budget_s": args.budget_s,
                    "stages": {}}  # fmt: skip
    for name, fn in stages:
        if time.monotonic() >= deadline:
            report["stages"][name] = {"status": "skipped", "summary": "no time left"}
            continue
        t0 = time.monotonic()
        d = out / name
        d.mkdir(exist_ok=True)
        try:
            res = fn(d)
        except Exception as e:  # noqa: BLE001 - a failed stage is recorded, the next one runs
            res = {"status": "error", "summary": f"{type(e).__name__}: {str(e)[:300]}"}
        res["seconds"] = round(time.monotonic() - t0, 1)
        report["stages"][name] = res
        (out / "suite.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"gpu_suite: {name}: {res['status']} in {res['seconds']} s: {res['summary']}")
    report["seconds"] = round(time.monotonic() - start, 1)
    (out / "suite.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["| stage | status | seconds | summary |", "|---|---|---|---|"]
    for name, res in report["stages"].items():
        lines.append(f"| {name} | {res['status']} | {res.get('seconds', '-')} | {res['summary']} |")
    (out / "README.md").write_text(
        f"GPU suite on {args.device}{' (tiny)' if args.tiny else ''}, "
        f"{report['seconds']} s of a {args.budget_s:g} s budget:\n\n" + "\n".join(lines) + "\n"
    )
    return 0 if all(r["status"] in ("ok", "skipped") for r in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
