#!/usr/bin/env bash
# The CPU quality table of docs/quality.md, in the order this session ran it: MQAR at 64 tokens,
# duplication, ListOps, MQAR at 1,024 and 256, PTB characters; one seed at learning rate 1e-3
# (the sweep and the other seeds are the budget's full plan: drop --seeds and --lr).
# Resumable: rerun the same script to continue where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/quality_cpu
DATA=${EFFIFORMER_DATA:-../shared/data}
common=(--part quality --budget cpu --seeds 1 --lr 1e-3 --data "$DATA" --out "$OUT" --no-progress)
effiformer bench "${common[@]}" --tasks mqar --lengths 64
effiformer bench "${common[@]}" --tasks duplication listops
effiformer bench "${common[@]}" --tasks mqar --lengths 1024 256
effiformer bench "${common[@]}" --tasks lm-ptb
