#!/usr/bin/env bash
# Issue 26: HAT end to end on this machine (Multi30k En->De), the commands in order, as run on
# 2026-12-03 (Intel Xeon, 2 cores; results in benchmarks/results/hat_end_to_end_cpu/). Every step
# is resumable (run it again with the same folder to continue). Two one-thread lanes at most;
# whatever is timed (latencies, step times) stops the other lane (--pause PID) meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-runs}
COMMON=(--super "$RUNS/hat-super" --predictor "$RUNS/hat-lat/predictor.pt" --limits 75 110
        --dense auto --equal-compute 1200 --smallest-seeds 2 --runs 10 --warmup 3
        --data "$DATA" --out "$RUNS/hat-search")

# 1. The SuperTransformer (hat-multi30k-super: 4+4 layers, d 320, one SubTransformer sampled per
#    update; Adam (0.9, 0.98), lr 1e-3 after 1,000 warmup steps, inverse sqrt, label smoothing
#    0.1, 4,096-token batches), one thread, 2,500 steps, checkpoints every 250, inherited greedy
#    BLEU of the largest and smallest SubTransformers every 500 (lane A).
python benchmarks/hat_supernet_multi30k.py --threads 1 --eval-every 500 --eval-sentences 200 \
    --checkpoint-every 250 --steps 2500 --out "$RUNS/hat-super" --data "$DATA" &
SUPER=$!

# 2. The latency dataset and predictor, measured on THIS machine (300 SubTransformers, batch 1,
#    30 tokens, beam 5; ~7 min), with the SuperTransformer stopped meanwhile. The committed
#    dataset of benchmarks/results/hat_latency_multi30k_quiet/ is from another CPU (AMD EPYC):
#    a predictor serves the machine it was measured on.
kill -STOP $SUPER
python benchmarks/hat_latency_multi30k.py --n 300 --runs 10 --warmup 3 --out "$RUNS/hat-lat"
kill -CONT $SUPER

# 3. Lane B while the SuperTransformer trains: the dense baselines (for each limit the scaled
#    transformer-multi30k of DENSE_GRID measured largest under it), timed quietly and trained
#    for the steps that fit 1,200 s of their own step time; two seeds at the lower limit.
python benchmarks/hat_search_multi30k.py "${COMMON[@]}" --dense-only --pause $SUPER &
LANE_B=$!
wait $SUPER

# 4. Searches (HAT's evolution with 10 iterations instead of 30 and fitness on 100 validation
#    sentences instead of 500, for time: 6 and 11 minutes) with the inherited test BLEU of each
#    winner and of the largest/smallest SubTransformers (--anchors); every model's latency and
#    quiet step time (lane B stopped meanwhile); then lane A trains the winner at the lower limit
#    with two seeds, and lane B, once its dense jobs are done, the winner at the higher limit.
#    (The anchors' from-scratch jobs, anchor-largest-s0 / anchor-smallest-s0, were planned and
#    timed but not trained for want of time: the winners are the inherited/from-scratch pairs.)
SEARCH=(--iterations 10 --fitness-sentences 100 --inherited-bleu --anchors)
python benchmarks/hat_search_multi30k.py "${COMMON[@]}" "${SEARCH[@]}" --plan-only --pause $LANE_B
python benchmarks/hat_search_multi30k.py "${COMMON[@]}" "${SEARCH[@]}" --only hat-75-s0 hat-75-s1 &
LANE_A=$!
wait $LANE_B
python benchmarks/hat_search_multi30k.py "${COMMON[@]}" "${SEARCH[@]}" --only hat-110-s0
wait $LANE_A

# 5. Every model's latency again, three interleaved rounds on the quiet machine; table and plots.
python benchmarks/hat_search_multi30k.py "${COMMON[@]}" "${SEARCH[@]}" --remeasure 3 --no-train

# 6. Beyond HAT (2026-12-07, the Xeon, beside the long-context tinyshakespeare lanes, which it
#    stopped while it measured or timed): the Sparse Transformer's own knobs at T = 4,096, limits
#    set by the long-context table's sparse-strided and dense rows, the first winner trained on
#    PTB at equal compute with its row (the dense-limit winner not trained, for time). PAUSE:
#    the PIDs of lanes running beside it, if any (their process groups are stopped).
python benchmarks/hat_beyond.py --family sparse --n 120 --runs 5 --warmup 1 \
    --limits sparse-strided dense --quality-limits sparse-strided \
    --quality-from benchmarks/results/long_context_cpu ${PAUSE:+--pause $PAUSE} \
    --data "$DATA" --out benchmarks/results/hat_beyond_sparse_cpu

