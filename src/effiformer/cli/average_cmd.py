"""``effiformer average``: the mean of a run's last N checkpoints, as a run of its own."""

from __future__ import annotations

import argparse
import json

from .common import add_common_flags, positive_int, setup_logging

EPILOG = """examples:
  effiformer train transformer-multi30k --task translation --data DATA/multi30k --src en \\
      --tgt de --checkpoint-every 500 --keep 5 --out runs/mt
  effiformer average runs/mt --last 5 --out runs/mt-avg5
  effiformer eval runs/mt-avg5 --eval-beam 4 --eval-lenpen 0.6"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "average",
        help="average the weights of a run's last N checkpoints (a run eval and translate take)",
        description="Average the weights of the last N checkpoints of a run (Vaswani et al. "
        "2017; Lite Transformer and HAT average the last 10) and write them as a run of its own.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="the run folder (effiformer train ... --out RUN)")
    p.add_argument("--last", type=positive_int, required=True, help="checkpoints to average")
    p.add_argument("--out", required=True, help="the new run folder")
    add_common_flags(p, progress=False)


def run(args: argparse.Namespace) -> int:
    from ..average import average_run

    setup_logging()
    path = average_run(args.run, args.last, args.out)
    print(json.dumps({"averaged": args.last, "run": args.run, "checkpoint": str(path)}))
    print(f"averaged the last {args.last} checkpoints of {args.run} into {path}")
    return 0
