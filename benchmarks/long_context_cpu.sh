#!/usr/bin/env bash
# Issue 25: long context at equal compute on the 2-core CPU. Each line is a command as it ran,
# in order; every one is resumable (run it again in the same folder to continue).
# Budget `cpu-long`: the *-small size (d 256, 4 layers, 4 heads) at T = 4,096, 900 s of quiet
# one-thread time per model (steps from timings taken alone on the quiet machine, OUT/timing.json),
# two cells at a time; learning rate 2e-3 for all (no sweep at this budget).
# 2026-12-08: adaptive span's row became the official model (no absolute position embeddings);
# the adaptive-span cells these commands made before then are the ablation adaptive-span-abspos
# (records renamed so); run again, they run the new row.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/long_context_cpu
DATA=${DATA:-../shared/data}

# 1. every mechanism, seed 0 (the recurrent ones first, so their memory curves can run early)
effiformer bench --part quality --budget cpu-long --tasks lm-ptb --lengths 4096 --lr 2e-3 \
    --seeds 1 --equal-time 900 --cell-timeout 5400 --data "$DATA" --out "$OUT" \
    --attention xl compressive dense local sparse-strided sparse-fixed adaptive-span routing lsh lsra

# 2. second seed of dense (run beside step 1 once dense's seed 0 was recorded; the harness skips
#    recorded cells, so the two processes never share a cell)
effiformer bench --part quality --budget cpu-long --tasks lm-ptb --lengths 4096 --lr 2e-3 \
    --seeds 2 --equal-time 900 --cell-timeout 5400 --data "$DATA" --out "$OUT" --attention dense

# 2b. dense continued to sparse strided's 1,060 steps (equal steps: is sparse's win only its
#     cheaper step?), in a folder of its own
python benchmarks/quality_extend.py --from "$OUT" --cell lm-ptb/dense/T4096/lr0.002/s0 \
    --steps 1060 --out benchmarks/results/long_context_cpu_dense_equal_steps --data "$DATA"

# 2c. second seed of LSRA, the best row (run alone after step 1, beside the Multi30k run of issue
#     23 on the other core)
effiformer bench --part quality --budget cpu-long --tasks lm-ptb --lengths 4096 --lr 2e-3 \
    --seeds 2 --equal-time 900 --cell-timeout 5400 --data "$DATA" --out "$OUT" --attention lsra

# 3. the table and the plot against estimated quiet minutes
python benchmarks/long_context_report.py --out "$OUT"

# 4. Transformer-XL and Compressive with 0, 0.5, 1, 2, 4x their training memory at evaluation:
#    the T = 1,024 models of the quality table (benchmarks/quality_lm_cpu.sh), which learned to
#    use context; the cpu-long ones stayed at the unigram level within their 71-72 steps
python benchmarks/long_context_memory.py --out benchmarks/results/quality_cpu_lm --data "$DATA" \
    --whole-split --factors 0 0.5 1 2 4

# 5. tinyshakespeare (2026-12-07, the Xeon): the same budget and models. The step timings are
#    PTB's (the same model and shapes at T = 4,096, vocabularies of 50 characters and 256 bytes), copied
#    into timing.json under lm-shakespeare/... keys with "copied_from", so both data sets give
#    each mechanism the same steps. Two lanes (one cell each at a time; disjoint mechanisms).
#    Transformer-XL and Compressive were left out for time (their PTB cells took 2,723-2,795 s
#    each, a third of it scoring the whole split through the recurrence).
python - "$OUT/timing.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
for k, v in list(t.items()):
    new = "lm-shakespeare/" + k.split("/", 1)[1]
    if k.startswith("lm-ptb/") and new not in t:
        t[new] = {**v, "copied_from": k}
json.dump(t, open(sys.argv[1], "w"), indent=1)
PY
LANE=(effiformer bench --part quality --budget cpu-long --tasks lm-shakespeare --lengths 4096
      --lr 2e-3 --seeds 1 --equal-time 900 --cell-timeout 5400 --data "$DATA" --out "$OUT")
for m in dense adaptive-span sparse-strided lsh; do "${LANE[@]}" --attention $m; done &
for m in lsra local sparse-fixed routing; do "${LANE[@]}" --attention $m; done
wait
python benchmarks/long_context_report.py --out "$OUT"

