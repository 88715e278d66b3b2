#!/usr/bin/env bash
# The CPU quality table of docs/quality.md, one seed at learning rate 1e-3 (the learning-rate
# sweep and the other seeds are the budget's full plan: drop --seeds and --lr). The order this
# session ran it: MQAR at 64 tokens; duplication and ListOps (the depth ablation started beside
# ListOps); MQAR at 1,024 for dense, local and routing (LSH was stopped unfinished at the end of
# the session), with the duplication ablations beside it. Then what this session did not reach:
# the other MQAR rows at 1,024, MQAR at 256, PTB characters.
# Resumable: rerun the same script to continue where it stopped (finished cells are skipped).
# 2026-12-08: adaptive span's row became the official model (no absolute position embeddings);
# the adaptive-span cells these commands made before then are the ablation adaptive-span-abspos
# (records renamed so); run again, they run the new row.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/quality_cpu
DATA=${EFFIFORMER_DATA:-../shared/data}
common=(--part quality --seeds 1 --lr 1e-3 --data "$DATA" --no-progress)
cpu=(--budget cpu --out "$OUT" "${common[@]}")
effiformer bench "${cpu[@]}" --tasks mqar --lengths 64
effiformer bench "${cpu[@]}" --tasks duplication listops
effiformer bench --budget cpu-deep "${common[@]}" --tasks mqar --attention sparse-fixed \
  --jobs 1 --out "$OUT"_deep
effiformer bench "${cpu[@]}" --tasks duplication --attention adaptive-span-full routing-wide \
  --out "$OUT"_ablations
effiformer bench "${cpu[@]}" --tasks mqar --lengths 1024 --attention dense local routing lsh
effiformer bench "${cpu[@]}" --tasks mqar --lengths 1024
effiformer bench "${cpu[@]}" --tasks mqar --lengths 256
effiformer bench "${cpu[@]}" --tasks lm-ptb
# 2026-12-07, third session (the Xeon): the budget's full plan for duplication and ListOps
# (the sweep 1e-3 / 3e-3 / 1e-2 at seed 0, then the seeds at each row's best rate: three on
# duplication, two on ListOps; the seed-0 cells at 1e-3 above are reused), two lanes with
# disjoint rows, one cell each
lane=(--budget cpu --out "$OUT" --data "$DATA" --no-progress --part quality --jobs 1)
effiformer bench "${lane[@]}" --tasks duplication --attention dense local sparse-strided \
  sparse-fixed routing
effiformer bench "${lane[@]}" --tasks duplication --attention adaptive-span lsra lsh relative-xl
effiformer bench "${lane[@]}" --tasks listops --attention dense local sparse-strided sparse-fixed
effiformer bench "${lane[@]}" --tasks listops --attention routing lsh lsra funnel
# 2026-12-07, fifth session: relative-XL's row became Transformer-XL's model (no absolute position
# embeddings); the duplication cells of the old model were renamed relative-xl-abspos (an
# ablation now), and the row ran again (its sweep at 256 and three seeds)
effiformer bench --part quality --budget cpu --tasks duplication --out "$OUT" --no-progress \
    --jobs 1 --attention relative-xl
# 2026-12-08, sixth session: routing with the released models' positions (routing-rel), at the
# rate the row's sweep picked (3e-3), seed 0, in the ablations folder
effiformer bench --part quality --budget cpu --tasks duplication --seeds 1 --lr 3e-3 --no-progress \
    --jobs 1 --attention routing-rel --out benchmarks/results/quality_cpu_ablations
# (41.3% against the row's 2%): routing-nopos, which of its two changes moves it, and routing-rel's
# other two seeds
effiformer bench --part quality --budget cpu --tasks duplication --seeds 1 --lr 3e-3 --no-progress \
    --jobs 1 --attention routing-nopos --out benchmarks/results/quality_cpu_ablations
effiformer bench --part quality --budget cpu --tasks duplication --seeds 3 --lr 3e-3 --no-progress \
    --jobs 1 --attention routing-rel --out benchmarks/results/quality_cpu_ablations
