#!/usr/bin/env bash
# The CPU quality table (docs/quality.md): MQAR at 64 and 1,024 tokens first, then duplication,
# ListOps, MQAR at 256 and PTB characters. Resumable: rerun the same script to continue.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/quality_cpu
DATA=${EFFIFORMER_DATA:-../shared/data}
common=(--part quality --budget cpu --seeds 1 --lr 1e-3 --data "$DATA" --out "$OUT" --no-progress)
effiformer bench "${common[@]}" --tasks mqar --lengths 64 1024
effiformer bench "${common[@]}" --tasks duplication listops mqar lm-ptb
