#!/usr/bin/env bash
# Issue 26: HAT end to end on this machine (Multi30k En->De), the commands in order. Every step is
# resumable (run it again with the same folder to continue); the long ones run in the background,
# one timed job at a time. Status of each step is in the comment above it.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-runs}

# 1. The SuperTransformer (hat-multi30k-super: 4+4 layers, d 320, one SubTransformer sampled per
#    update; Adam (0.9, 0.98), lr 1e-3 after 1,000 warmup steps, inverse sqrt, label smoothing
#    0.1, 4,096-token batches), one thread, checkpoints every 250 steps, inherited greedy BLEU of
#    the largest and smallest SubTransformers every 500. Started 2026-12-03 beside the Multi30k
#    run of issue 23 (2.2 s a step on the shared core), stopped at its step-1,500 checkpoint
#    (benchmarks/results/hat_supernet_multi30k_cpu/); continue it with the same command.
python benchmarks/hat_supernet_multi30k.py --threads 1 --eval-every 500 --eval-sentences 200 \
    --checkpoint-every 250 --out "$RUNS/hat-super" --data "$DATA"

# 2. The latency predictor from the 300 SubTransformers measured on this CPU (committed in
#    benchmarks/results/hat_latency_multi30k_quiet/): the dataset is resumable, so with its 300
#    rows copied in only the predictor trains (seconds).
mkdir -p "$RUNS/hat-lat"
cp -n benchmarks/results/hat_latency_multi30k_quiet/multi30k_cpu.csv* "$RUNS/hat-lat/"
python benchmarks/hat_latency_multi30k.py --n 300 --runs 10 --warmup 3 --out "$RUNS/hat-lat"

# 3. Inherited against from-scratch (the paper's check that the supernet is trained enough:
#    --anchors, the largest and smallest SubTransformers), then the search under two latency limits inside the measured range (37-133 ms a sentence, batch 1,
#    beam 5), the winners and the dense baselines trained from scratch for the same budget on a
#    quiet machine, every model's latency measured as the dataset was:
python benchmarks/hat_search_multi30k.py --super "$RUNS/hat-super" \
    --predictor "$RUNS/hat-lat/predictor.pt" --limits 60 90 --inherited-bleu --anchors \
    --dense auto --train-budget 1200 --data "$DATA" --out "$RUNS/hat-search"
