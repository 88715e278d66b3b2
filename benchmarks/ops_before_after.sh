#!/usr/bin/env bash
# Issue 24: the CPU speed of the kernels before and after they moved to the ops floor (and became
# registered operators), in one run on a quiet machine: the three layer benchmarks of the README's
# targets, each run from the tree before the move (its own scripts and library) and from this
# one, alternating before / after per benchmark so that drift in the machine hits both alike.
# Nothing else may run meanwhile (about 30-40 minutes on the 2-core CPU).
#
#   bash benchmarks/ops_before_after.sh            # BEFORE defaults to the commit before the floor
#   BEFORE=<sha> ROUNDS=2 bash benchmarks/ops_before_after.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${BEFORE:-58b7744^}
ROUNDS=${ROUNDS:-2}
OUT=benchmarks/results/ops_before_after
mkdir -p "$OUT"
TREE=$(mktemp -d /tmp/effiformer-before.XXXXXX)
git worktree add --detach "$TREE" "$BEFORE" >/dev/null
trap 'git worktree remove --force "$TREE"' EXIT
echo "before: $(git -C "$TREE" rev-parse --short HEAD), after: $(git rev-parse --short HEAD)" \
    | tee "$OUT/commits.txt"
for round in $(seq 1 "$ROUNDS"); do
  for side in before after; do
    root=$([ "$side" = before ] && echo "$TREE" || pwd)
    run() { (cd "$root" && PYTHONPATH="$root/src" python "$@"); }
    run benchmarks/sparse_speed.py --threads 2 --rounds 3 --lengths 4096 16384 \
        --out "$(pwd)/$OUT/sparse_speed_${side}_r${round}.jsonl"
    run benchmarks/routing_bench.py --lengths 4096 16384 --repeats 3 --threads 2 \
        --out "$(pwd)/$OUT/routing_bench_${side}_r${round}.jsonl"
    run benchmarks/reformer_bench.py --lengths 4096 16384 --repeats 3 --only attention \
        --out "$(pwd)/$OUT/reformer_bench_${side}_r${round}"
  done
done
python benchmarks/ops_before_after_report.py --out "$OUT"
