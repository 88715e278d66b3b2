"""``effiformer train``: parse, build the task through the task registry, take the family's
training recipe (flags override it), call :func:`effiformer.train.train`, print.

Task options are flags made from each registered task's options dataclass
(:mod:`effiformer.cli.flags`); this module names no task. On ``--resume`` the task, its options
and the train config come from the run (what was recorded in its checkpoint); flags given again
override them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ..checkpoint import (
    LATEST,
    CheckpointError,
    read_train_config,
    resolve_checkpoint,
    run_dir_of,
    verify_checkpoint,
)
from ..recipes import (
    NO_DECAY_RULES,
    OPTIMIZERS,
    RECIPE_FIELDS,
    SCHEDULES,
    apply_recipe,
    describe_training,
    recipe_for,
)
from ..tasks import BuildContext, get_task, list_tasks
from ..tasks.registry import make_options
from ..train import METRICS, TrainConfig, train
from .common import (
    EXIT_INTERRUPTED,
    GracefulInterrupt,
    add_common_flags,
    device_name,
    nonneg_int,
    positive_float,
    positive_int,
    saved_model_dir,
    saved_model_lacks,
    setup_logging,
)
from .flags import OptionFlags, add_option_flags

EPILOG = """examples:
  effiformer train vanilla-tiny --steps 50 --out runs/tiny        # the embedded corpus
  effiformer train vanilla-small --data DATA/tinyshakespeare/input.txt --format text \\
      --time-budget 600 --out runs/shakespeare                    # schedule sized to 600 s
  effiformer train vanilla-small --resume runs/shakespeare --steps 2000
  effiformer train xl-tiny --steps 3 --eval-mem-len 64 --eval-clamp-len 32 --out runs/xl
  effiformer train funnel-tiny --task mlm --text DATA/tinyshakespeare/input.txt \\
      --steps 200 --out runs/pre
  effiformer train --task glue-sst2 --init runs/pre --data DATA/glue/SST-2 --out runs/sst2
  effiformer train transformer-multi30k --task translation --data DATA/multi30k --src en \\
      --tgt de --max-tokens 4096 --time-budget 3600 --out runs/m30k
(DATA: your copy of the data sets, e.g. tinyshakespeare's input.txt; see the README.)

The optimiser, schedule, warmup, clipping and weight decay come from the model family's paper
recipe (printed when training starts); the recipe overrides override single fields of it. A recipe
warmup longer than 10% of the run is capped at 10% of the run. --time-budget without --steps
times the first steps and sizes the schedule to the steps that fit (logged, and recorded in
metrics.jsonl); with --steps the run stops at whichever comes first.

Ctrl-C: the step in progress finishes, a checkpoint is written and the resume command printed
(exit 130); a second Ctrl-C quits at once (checkpoints are atomic: the last one stays intact).

Several processes (DDP; gloo on CPU, nccl on CUDA): the global batch is shared by the ranks and
only rank 0 writes files, so N processes follow the loss curve of one.
  torchrun --nproc_per_node 2 -m effiformer train vanilla-small --batch 16 --out runs/ddp
Two machines, 2 processes each (the same command, data path and code on both; --out on a
shared file system, since every rank reads the checkpoint it resumes from):
  torchrun --nnodes 2 --node-rank 0 --nproc_per_node 2 --master-addr HOST0 \\
      --master-port 29500 -m effiformer train vanilla-small --out /shared/runs/ddp   # on HOST0
  torchrun --nnodes 2 --node-rank 1 --nproc_per_node 2 --master-addr HOST0 \\
      --master-port 29500 -m effiformer train vanilla-small --out /shared/runs/ddp   # on HOST1
  (or, with elastic rendezvous on every machine: torchrun --nnodes 2 --nproc_per_node 2
   --rdzv-backend c10d --rdzv-endpoint HOST0:29500 --rdzv-id job1 -m effiformer train ...)
"""

#: TrainConfig recipe fields -> the flags that override them.
RECIPE_FLAGS = {
    "optimizer": "--optimizer",
    "lr": "--lr",
    "betas": "--betas",
    "eps": "--eps",
    "weight_decay": "--weight-decay",
    "no_decay": "--no-decay",
    "warmup": "--warmup",
    "schedule": "--schedule",
    "min_lr_ratio": "--min-lr-ratio",
    "clip": "--clip",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a registered model on a registered task",
        description="Train a registered model on a registered task (default: language modelling "
        "on the embedded corpus or a corpus on disk).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tasks = list_tasks()
    p.add_argument("name", nargs="?", help="registered model name (optional with --resume)")
    p.add_argument(
        "--task",
        choices=tasks,
        default=None,
        help="registered task (default: lm, or the resumed run's): "
        + "; ".join(f"{t}: {get_task(t).description}" for t in tasks),
    )
    p.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. --set attention.name=local attention.window=64 (repeatable; "
        "vocab_size comes from the data)",
    )
    p.add_argument("--seed", type=int, help="seed of weights, dropout and data order (default 0)")
    p.add_argument("--device", type=device_name, help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on for CUDA with bf16, off on CPU)",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="train under torch.compile (default backend inductor; aot_eager traces without "
        "code generation); the first steps of each new shape compile",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        help="total optimiser steps (default 1000; with --time-budget: as many as fit)",
    )
    p.add_argument(
        "--time-budget",
        type=positive_float,
        help="stop after this many seconds; without --steps the schedule is sized to fit",
    )
    p.add_argument("--grad-accum", type=positive_int, help="micro-batches per step (default 1)")
    p.add_argument(
        "--eval-every", type=nonneg_int, help="evaluate every N steps (default 200; 0 = end only)"
    )
    p.add_argument(
        "--checkpoint-every", type=positive_int, help="checkpoint every N steps (default: end only)"
    )
    p.add_argument("--keep", type=positive_int, help="checkpoints to keep (default 1)")
    p.add_argument("--out", help="output directory (default runs/NAME, or the --resume run)")
    p.add_argument("--resume", help="run or checkpoint directory to continue from")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common_flags(p, progress=False, threads=True)
    r = p.add_argument_group(
        "recipe overrides", "each replaces one field of the family's recipe (default: the recipe)"
    )
    r.add_argument("--optimizer", choices=OPTIMIZERS, help="optimiser")
    r.add_argument("--lr", type=float, help="peak learning rate")
    r.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), help="Adam(W) betas")
    r.add_argument("--eps", type=float, help="optimiser epsilon")
    r.add_argument("--weight-decay", type=float, help="weight decay")
    r.add_argument(
        "--no-decay",
        choices=list(NO_DECAY_RULES),
        help="parameters without weight decay: "
        + "; ".join(f"{k}: {v}" for k, v in NO_DECAY_RULES.items()),
    )
    r.add_argument("--warmup", type=nonneg_int, help="linear warmup steps")
    r.add_argument("--schedule", choices=SCHEDULES, help="lr schedule after the warmup")
    r.add_argument("--min-lr-ratio", type=float, help="floor of cosine/linear decay, x peak lr")
    r.add_argument("--clip", type=float, help="gradient clipping norm, 0 = off")
    flags = add_option_flags(
        p,
        [(t, get_task(t).options) for t in tasks],
        title="task options",
        description="each task takes the options its help names (lm, mlm, glue-*, ...)",
    )
    p.set_defaults(task_flags=flags)


def _pick(value: Any, saved: dict[str, Any], key: str, default: Any) -> Any:
    if value is not None:
        return value
    return saved.get(key, default)


def _recipe_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for key in RECIPE_FIELDS:
        value = getattr(args, key)
        if value is None:
            continue
        if key == "clip":
            value = value or None  # 0 = off
        if key == "betas":
            value = tuple(value)
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    flags: OptionFlags = args.task_flags
    setup_logging()
    rank0 = int(os.environ.get("RANK", "0")) == 0
    resume = saved_train = None
    name = args.name
    task_name = args.task or "lm"
    if args.resume is not None:
        bare = saved_model_dir(args.resume)
        if bare is not None:
            raise saved_model_lacks(
                bare,
                "the trainer state, task and data (trainer.pt, train_config.json, meta.json) that "
                "--resume continues a run from",
                "--resume takes the run folder of effiformer train NAME ... --out RUN",
            )
        resume = resolve_checkpoint(args.resume)
        meta = verify_checkpoint(resume)
        saved_train = read_train_config(resume)
        saved_task = saved_train.get("task") or (meta.get("task") or {}).get("task") or "lm"
        if args.task is not None and args.task != saved_task:
            raise CheckpointError(
                f"--resume {args.resume!r} holds a {saved_task!r} run, not --task {args.task}"
            )
        task_name = saved_task
        saved_name = meta.get("model_name")
        if args.name and saved_name and args.name != saved_name:
            raise CheckpointError(
                f"--resume {args.resume!r} holds a {saved_name!r} run, not {args.name!r}"
            )
        name = args.name or saved_name
    if resume is None:
        # refused before the task loads its data: an --out (or the default runs/NAME) that
        # already holds a run is continued with --resume, never overwritten
        early_out = Path(args.out) if args.out else (Path("runs") / name if name else None)
        if early_out is not None and (early_out / LATEST).exists():
            raise CheckpointError(
                f"--out {str(early_out)!r} already holds a run (it has {LATEST!r}); continue it "
                f"with --resume {shlex.quote(str(early_out))} or choose another --out"
            )
    saved = saved_train or {}
    spec = get_task(task_name)
    what = f"--task {task_name}"
    values = {**(saved.get("task_options") or {}), **flags.values(args, task_name, what=what)}
    options = make_options(spec.options, values, owner=what)
    seed = _pick(args.seed, saved, "seed", 0)
    setup = spec.build(
        options, BuildContext(model_name=name, overrides=tuple(args.set), seed=seed, resume=resume)
    )

    if args.steps is not None:
        steps = args.steps
    elif resume is not None:
        steps = saved.get("steps", 1000)  # None: the schedule a time budget planned
    else:
        steps = None if args.time_budget is not None else 1000
    overrides = _recipe_overrides(args)
    if resume is not None:
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        recipe_values = {k: saved.get(k, defaults[k]) for k in RECIPE_FIELDS}
        recipe_values["betas"] = tuple(recipe_values["betas"])
        recipe_values.update(overrides)
        line = f"train config of the resumed run: {describe_training(recipe_values)}"
    else:
        family = getattr(getattr(setup.model, "config", None), "family", None)
        recipe = setup.recipe or recipe_for(setup.model_name, str(family))
        choice = apply_recipe(recipe, steps=steps, overrides=overrides)
        recipe_values = choice.values
        line = choice.describe()
        if steps is None:
            line += "; schedule sized from --time-budget" + (
                "" if "warmup" in overrides else " (warmup at most 10% of it)"
            )
    if overrides:
        line += "; overridden: " + ", ".join(
            RECIPE_FLAGS[k] for k in RECIPE_FIELDS if k in overrides
        )
    if rank0:
        print(line, flush=True)

    default_out = run_dir_of(resume) if resume is not None else Path("runs") / setup.model_name
    out = args.out or str(default_out)
    eval_every = _pick(args.eval_every, saved, "eval_every", 200)
    config = TrainConfig(
        steps=steps,
        **recipe_values,
        grad_accum=_pick(args.grad_accum, saved, "grad_accum", 1),
        seed=seed,
        device=_pick(args.device, saved, "device", "auto"),
        bf16=_pick(args.bf16, saved, "bf16", None),
        compile=_pick(args.compile, saved, "compile", None),
        time_budget=args.time_budget,
        planned_warmup_cap=None if "warmup" in overrides else 0.1,
        eval_every=eval_every or None,
        checkpoint_every=_pick(args.checkpoint_every, saved, "checkpoint_every", None),
        keep_checkpoints=_pick(args.keep, saved, "keep_checkpoints", 1),
        out_dir=out,
        resume=args.resume,
        progress=not args.no_progress,
        model_name=setup.model_name,
        task=task_name,
        task_options=dataclasses.asdict(options),
    )
    with GracefulInterrupt("train") as stop:
        history = train(setup.model, setup.task, config, stop=stop)
    if history.stop_reason == "interrupted":
        if rank0:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            launcher = (
                f"torchrun --nproc_per_node {world} -m effiformer" if world > 1 else "effiformer"
            )
            print(
                f"effiformer train: interrupted at step {history.step}; checkpoint "
                f"{history.checkpoint}; resume with: {launcher} train --resume {shlex.quote(out)}",
                file=sys.stderr,
                flush=True,
            )
        return EXIT_INTERRUPTED
    if rank0:
        last = history.evals[-1] if history.evals else {}
        metric = getattr(setup.task, "metric_name", "metric")
        key = f"val_{metric}"
        val = f"; {config.eval_split} {metric} {last[key]:.4f}" if key in last else ""
        print(
            f"trained {setup.model_name} ({task_name}) on {setup.data_name} to step "
            f"{history.step} (stopped: {history.stop_reason}) in {history.seconds:.1f} s{val}; "
            f"checkpoint {history.checkpoint}; metrics {Path(out) / METRICS}"
        )
        print(json.dumps({"task": task_name, "step": history.step, **last}))
    return 0
