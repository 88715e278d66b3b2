#!/usr/bin/env bash
# MQAR on the CPU budget, the task as it now is (fill without key copies; cells at 256 and
# 1,024 tokens train on the length ladder from 64: Zoology's several-configuration training),
# one seed, the budget's learning-rate sweep (1e-3, 3e-3, 1e-2) at 64 tokens. Dense first: the
# table means nothing unless dense solves every length; then the other mechanisms.
# Resumable: rerun the same script to continue where it stopped (finished cells are skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/quality_cpu_mqar
common=(--part quality --budget cpu --tasks mqar --seeds 1 --out "$OUT" --no-progress)
effiformer bench "${common[@]}" --attention dense
effiformer bench "${common[@]}" --attention local sparse-strided sparse-fixed routing lsh lsra \
  relative-xl adaptive-span
