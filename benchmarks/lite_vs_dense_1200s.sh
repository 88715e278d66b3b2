#!/usr/bin/env bash
# Issue 27: Lite Transformer against dense at equal Mult-Adds on Multi30k En->De, 1,200 s of quiet
# single-thread CPU time per model (steps from timings taken alone on the quiet machine,
# OUT/timing.json), two models at a time (Lite in lane 0, dense in lane 1), two seeds for the
# smallest pair. Each line is a command as it ran; every one is resumable (run it again).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/lite_vs_dense_1200s
RUNS=${RUNS:-/work/runs/lite_vs_dense_1200s}  # checkpoints: outside git
DATA=${DATA:-../shared/data}
A=(--out "$OUT" --runs "$RUNS" --data "$DATA" --equal-time 1200 --warmup 500)

# 1. each model's step, alone on the quiet machine, one thread
python benchmarks/lite_vs_dense_equal_time.py --phase time "${A[@]}"
# 2. the eight runs, two processes at a time (their step budgets do not depend on the load)
python benchmarks/lite_vs_dense_equal_time.py --phase train --lane 0/2 "${A[@]}" &
python benchmarks/lite_vs_dense_equal_time.py --phase train --lane 1/2 "${A[@]}"
wait
# 3. decoding latency of every trained model, alone on the quiet machine
python benchmarks/lite_vs_dense_equal_time.py --phase latency "${A[@]}"
# 4. table and plots
python benchmarks/lite_vs_dense_equal_time.py --phase report "${A[@]}"
