#!/usr/bin/env bash
# The checks on the PTB rows of docs/quality.md (after benchmarks/quality_lm_cpu.sh's first loop):
# dense continued to 12,000 steps, dense with sinusoidal positions, and routing with every head
# local through the routing part; then (2026-12-07, third session) routing with its routed head
# muted (routing-mute, two seeds), routing's own second seed, and what the trained routing models
# do with their routed head (benchmarks/routing_routed_head.py). Resumable: rerun to continue (finished cells are skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${EFFIFORMER_DATA:-../shared/data}
python benchmarks/quality_extend.py --from benchmarks/results/quality_cpu_lm \
  --cell lm-ptb/dense/T1024/lr0.003/s0 --steps 12000 \
  --out benchmarks/results/quality_cpu_lm_dense_long --data "$DATA"
common=(--part quality --budget cpu --data "$DATA" --out benchmarks/results/quality_cpu_lm_ablations
  --no-progress --tasks lm-ptb --seeds 1 --lr 3e-3 --jobs 1)
effiformer bench "${common[@]}" --attention dense-sinusoidal
effiformer bench "${common[@]}" --attention routing-local --threads 2
effiformer bench "${common[@]}" --attention routing-mute --seeds 2
effiformer bench "${common[@]}" --attention routing --seeds 2 --out benchmarks/results/quality_cpu_lm
python benchmarks/routing_routed_head.py --out benchmarks/results/quality_cpu_lm --data "$DATA" \
  --cells lm-ptb/routing/T1024/lr0.003/s1 lm-shakespeare/routing/T1024/lr0.003/s0
# 2026-12-08, sixth session: routing with the released models' positions (relative key and
# value tables in both head types, M = 2 x window; no absolute embeddings), seed 0
effiformer bench "${common[@]}" --attention routing-rel
# (it reached 1.834 test bpc, the row 2.477 / 2.094): its second seed, and routing-nopos (the
# row without absolute positions and without the tables: which of the two changes does it)
effiformer bench "${common[@]}" --attention routing-rel --seeds 2
effiformer bench "${common[@]}" --attention routing-nopos
