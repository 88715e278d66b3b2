"""``effiformer eval``: score a checkpoint through the task that trained it (the task recorded in
its ``meta.json``, resolved by the task registry), print a JSON record (and a summary line).
A folder of :func:`effiformer.save_model` records no task or data (nor the vocabulary its ids
mean): it is refused in one line that says so."""

from __future__ import annotations

import argparse
import json

from ..checkpoint import resolve_checkpoint, verify_checkpoint
from ..progress import progress_enabled
from ..tasks import get_task, list_tasks
from ..tasks.registry import make_options
from .common import (
    add_common_flags,
    device_name,
    saved_model_dir,
    saved_model_lacks,
    setup_logging,
)
from .flags import OptionFlags, add_option_flags

EPILOG = """examples:
  effiformer eval runs/tiny
  effiformer eval runs/ptb --data DATA/ptb --format ptb --split test
  effiformer eval runs/xl --mem-len 512 --clamp-len 128 --same-length
  effiformer eval runs/sst2                      # a GLUE fine-tuning run: its dev set
  effiformer eval runs/m30k --split test_2016_flickr --beam 5 --out hyps.de   # BLEU and chrF
(DATA: your copy of the data sets.) Progress bars go to stderr (--no-progress: none); the
JSON record and the summary line to stdout. eval needs a training run (effiformer train ... --out
RUN): a folder of effiformer.save_model records neither the task and data to score it on nor
the vocabulary of its ids."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a checkpoint",
        description="Evaluate a checkpoint on a split, through the task it was trained on.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "checkpoint",
        help="run directory (uses its latest checkpoint) or checkpoint of effiformer train",
    )
    p.add_argument(
        "--split",
        default="valid",
        metavar="SPLIT",
        help="split to score (default valid): lm: train, valid, test; GLUE: train, valid (= dev), "
        "test where labelled; translation: valid, test or any split of the data folder, e.g. "
        "test_2016_flickr",
    )
    p.add_argument(
        "--device", type=device_name, default="auto", help="auto | cpu | cuda (default auto)"
    )
    add_common_flags(p, threads=True)
    specs = [(t, get_task(t).eval_options) for t in list_tasks()]
    flags = add_option_flags(
        p,
        specs,
        title="task options",
        description="each applies to checkpoints of the tasks its help names",
    )
    p.set_defaults(task_flags=flags)


def run(args: argparse.Namespace) -> int:
    flags: OptionFlags = args.task_flags
    setup_logging()
    saved = saved_model_dir(args.checkpoint)
    if saved is not None:
        raise saved_model_lacks(
            saved,
            "the task, data and vocabulary that eval scores a checkpoint with (a training run's "
            "meta.json and vocab.json or tokenizer.json)",
            "pass the run folder of effiformer train NAME ... --out RUN",
        )
    checkpoint = resolve_checkpoint(args.checkpoint)
    meta = verify_checkpoint(checkpoint)
    task_name = (meta.get("task") or {}).get("task") or "lm"
    spec = get_task(task_name)
    what = f"a {task_name!r} checkpoint"
    if spec.evaluate is None or spec.eval_options is None:
        raise ValueError(f"{str(checkpoint)!r} is {what}; that task has no evaluation")
    options = make_options(
        spec.eval_options, flags.values(args, task_name, what=f"evaluating {what}"), owner=what
    )
    with progress_enabled(not args.no_progress):
        report = spec.evaluate(checkpoint, meta, options, split=args.split, device=args.device)
    print(json.dumps(report.record))
    if report.summary:
        print(report.summary)
    return 0
