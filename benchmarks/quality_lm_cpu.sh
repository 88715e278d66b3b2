#!/usr/bin/env bash
# Character-level LM rows of the CPU quality table (docs/quality.md): PTB characters, then
# tinyshakespeare bytes, at T = 1,024 (Transformer-XL and Compressive: segments of 512 with 512
# tokens of memory), 5,000 steps of 4,096 tokens, the whole validation split scored every 500.
# One recipe for all: learning rate 3e-3, the rate at which dense left the bigram plateau
# (3.39 bpc) by step 2,000 in a 3,000-step probe; the relative-position family (5x dense's step
# time here) first, so that the slowest cells do not run alone at the end; then dense's own sweep
# (1e-3, 1e-2) as the check on that choice, then the second seeds. Two cells at a time, one
# thread each.
# Run so far: PTB's rows but relative-XL (2026-12-02/03); tinyshakespeare's vanilla rows but
# adaptive span, relative-XL, XL and Compressive, and PTB dense's sweep (2026-12-07; adaptive span
# on tinyshakespeare is in benchmarks/quality_span_clip.sh, with its span ratios clipped apart).
# Resumable: rerun the same script to continue (finished cells are skipped).
# 2026-12-08: adaptive span's row became the official model (no absolute position embeddings);
# the adaptive-span cells these commands made before then are the ablation adaptive-span-abspos
# (records renamed so); run again, they run the new row.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/quality_cpu_lm
DATA=${EFFIFORMER_DATA:-../shared/data}
common=(--part quality --budget cpu --data "$DATA" --out "$OUT" --no-progress)
rows=(compressive xl relative-xl dense local sparse-strided sparse-fixed adaptive-span routing lsh
  lsra)
for task in lm-ptb lm-shakespeare; do
  effiformer bench "${common[@]}" --tasks "$task" --attention "${rows[@]}" --seeds 1 --lr 3e-3
done
for task in lm-ptb lm-shakespeare; do
  for lr in 1e-3 1e-2; do
    effiformer bench "${common[@]}" --tasks "$task" --attention dense --seeds 1 --lr "$lr"
  done
done
for task in lm-ptb lm-shakespeare; do
  effiformer bench "${common[@]}" --tasks "$task" --attention "${rows[@]}" --seeds 2 --lr 3e-3
done
