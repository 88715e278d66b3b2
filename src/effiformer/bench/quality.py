"""The quality suite behind ``effiformer bench --part quality``: train every attention part on the
same tasks, in the same model, and score them side by side.

A *cell* is one (task, mechanism, length, learning rate, seed): a model of the budget's width and
depth (the ``vanilla`` decoder or encoder with the mechanism's attention part, or the
mechanism's own family: Transformer-XL, Compressive, Funnel) trained for the budget's optimizer
steps on the task and scored on the task's validation and test sets. Tasks
(:data:`TASKS`): ``mqar`` (multi-query associative recall, accuracy on the queried values),
``duplication`` (the Reformer paper's ``0w0w``, accuracy on the copy), ``listops`` (10-class
accuracy from the encoder's ``<cls>`` position; majority class recorded), ``lm-ptb`` and
``lm-shakespeare`` (character-level language modelling, bits per character on the whole
validation and test splits); LSH cells of the causal tasks are also scored with 1, 2, 4 and 8 hashes and with full
attention. Mechanisms (:data:`MECHANISMS`) carry their paper's settings for each length
(:func:`mechanism_settings`), recorded with every cell.

How a run goes (:func:`run_quality`):

1. plan: every cell's config is built on the meta device first, so a mechanism that cannot take a
   length (or does not fit a task) is refused in one line before anything is written;
2. learning-rate sweep: for every (task, mechanism), the budget's learning rates at the task's
   shortest length, seed 0;
3. main cells: the best swept rate (highest validation accuracy, lowest bpc) at every length and
   seed (the sweep's own cell is reused);
4. every cell runs in its own process (``python -m effiformer.bench --cell``), ``jobs`` at a time,
   with ``threads`` intra-op threads each; its training run lives in ``OUT/cells/ID/`` with
   checkpoints, so a killed cell resumes from its last checkpoint, and its record goes to
   ``OUT/results.jsonl`` when it ends (``status``: ``ok``, ``diverged`` — a non-finite loss,
   kept in the table as such — or ``error``);
5. ``OUT/table.md`` (mean and spread over seeds per task, mechanism and length), ``OUT/*.png``
   (MQAR accuracy against length; LM bits per character against step and against time).

A rerun with the same ``--out`` resumes: recorded cells are skipped, unfinished ones continue from
their checkpoints. The budget (model size, steps, lengths) is stored in ``OUT/quality.json``; a
rerun with another budget is refused unless ``force``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import closest
from .mechanisms import MECHANISMS, Mechanism, mechanism_settings

__all__ = [
    "BUDGETS",
    "MECHANISMS",
    "TASKS",
    "Mechanism",
    "QualityBudget",
    "QualityInterrupted",
    "TaskBudget",
    "format_quality_table",
    "mechanism_settings",
    "plan_cells",
    "plot_quality",
    "run_quality",
    "run_quality_cell",
]

logger = logging.getLogger(__name__)

RESULTS = "results.jsonl"
MANIFEST = "quality.json"
TABLE = "table.md"

# ---------------------------------------------------------------------------------- tasks

#: task -> (kind, metric, higher is better, description)
TASKS: dict[str, tuple[str, str, bool, str]] = {
    "mqar": ("causal", "accuracy", True, "multi-query associative recall (Zoology)"),
    "duplication": ("causal", "accuracy", True, "0w0w copy (Reformer Table 2)"),
    "listops": ("bidirectional", "accuracy", True, "ListOps, 10 classes (LRA)"),
    "lm-ptb": ("lm", "bpc", False, "PTB characters, bits per character"),
    "lm-shakespeare": ("lm", "bpc", False, "tinyshakespeare bytes, bits per character"),
}
#: where each LM task finds its data under the data folder, and the corpus format
LM_DATA = {"lm-ptb": ("ptb", "ptb-char"), "lm-shakespeare": ("tinyshakespeare/input.txt", "text")}


# ---------------------------------------------------------------------------------- mechanisms


def fits(mechanism: str, task: str) -> bool:
    return TASKS[task][0] in MECHANISMS[mechanism].kinds


# ---------------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class TaskBudget:
    """One task's share of a budget: ``lengths``; ``steps`` per cell; ``tokens`` per batch (the
    batch is ``tokens // length`` rows, at least ``min_batch``); ``seeds``; ``lrs`` swept at the
    shortest length; ``eval_every`` steps; task options (``options``)."""

    lengths: tuple[int, ...]
    steps: int
    tokens: int
    seeds: int
    lrs: tuple[float, ...]
    eval_every: int
    min_batch: int = 1
    warmup: int = 100
    options: dict[str, Any] = field(default_factory=dict)
    #: stop a cell once its validation metric reaches this (None: always train ``steps``);
    #: the record keeps the step it stopped at (``steps_done``)
    target: float | None = None
    #: steps at particular lengths instead of ``steps`` (longer sequences that need more)
    length_steps: dict[int, int] = field(default_factory=dict)
    #: the recurrent families' (Transformer-XL, Compressive) training segment; the rest of the
    #: T keys is memory (None: segments of T/2 with T/2 of memory)
    segment: int | None = None

    def batch(self, length: int) -> int:
        return max(self.min_batch, self.tokens // length)

    def steps_at(self, length: int) -> int:
        """Optimizer steps of a cell at ``length``."""
        return self.length_steps.get(length, self.steps)


@dataclass(frozen=True)
class QualityBudget:
    """A budget: the model every cell trains (``dim``, ``n_layers``, ``n_heads``), where
    (``device``, ``dtype``, ``threads`` per cell, ``jobs`` in parallel) and each task's share."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    tasks: dict[str, TaskBudget]
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 1
    jobs: int = 2
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_LRS = (1e-3, 3e-3, 1e-2)
BUDGETS: dict[str, QualityBudget] = {
    "smoke": QualityBudget(
        "smoke", dim=32, n_layers=1, n_heads=2, threads=1, jobs=2,
        tasks={
            "mqar": TaskBudget((64,), 6, 256, 1, (3e-3,), 3, min_batch=2),
            "duplication": TaskBudget((64,), 6, 256, 1, (3e-3,), 3, min_batch=2,
                                      options={"vocab_size": 16}),
            "listops": TaskBudget((32,), 6, 256, 1, (3e-3,), 3, min_batch=4,
                                  options={"eval_sequences": 32}),
            "lm-ptb": TaskBudget((64,), 4, 256, 1, (3e-3,), 2, min_batch=2,
                                 options={"eval_tokens": 4096}),
            "lm-shakespeare": TaskBudget((64,), 4, 256, 1, (3e-3,), 2, min_batch=2,
                                         options={"eval_tokens": 4096}),
        },
        description="seconds: proves the pipeline, learns nothing",
    ),
    "cpu": QualityBudget(
        "cpu", dim=64, n_layers=2, n_heads=2, threads=1, jobs=2,
        tasks={
            "mqar": TaskBudget((64, 256, 1024), 8000, 2048, 3, _LRS, 500, min_batch=2,
                               options={"eval_sequences": 256, "train_min_len": 64},
                               target=0.995, length_steps={1024: 24000}),
            "duplication": TaskBudget((256,), 2000, 2048, 3, _LRS, 500, min_batch=2,
                                      options={"vocab_size": 64}),
            "listops": TaskBudget((128,), 1500, 4096, 2, _LRS, 500, min_batch=8),
            "lm-ptb": TaskBudget((1024,), 5000, 4096, 2, _LRS, 500, min_batch=2),
            "lm-shakespeare": TaskBudget((1024,), 5000, 4096, 2, _LRS, 500, min_batch=2),
        },
        description="the 2-core CPU table (see docs/quality.md for its cost)",
    ),
    "cpu-deep": QualityBudget(
        "cpu-deep", dim=64, n_layers=4, n_heads=2, threads=1, jobs=2,
        tasks={
            "mqar": TaskBudget((64,), 8000, 2048, 1, (1e-3,), 500, min_batch=2,
                               options={"eval_sequences": 256}, target=0.995),
        },
        description="ablation: the CPU budget's MQAR with 4 layers instead of 2",
    ),
    "cpu-long": QualityBudget(
        "cpu-long", dim=256, n_layers=4, n_heads=4, threads=1, jobs=2,
        tasks={
            "lm-ptb": TaskBudget((4096,), 1000, 4096, 2, (2e-3,), 100, segment=512,
                                 options={"curve_eval_tokens": 65536}),
            "lm-shakespeare": TaskBudget((4096,), 1000, 4096, 2, (2e-3,), 100, segment=512,
                                         options={"curve_eval_tokens": 65536}),
        },
        description="long context at equal compute (issue 25): the *-small size (d 256, 4 "
        "layers, 4 heads) at T = 4,096, XL and Compressive on segments of 512 with 3,584 keys "
        "of memory; run with --equal-time (steps from quiet timings); the curve scores the "
        "first 65,536 validation characters, the end the whole splits",
    ),
    "gpu": QualityBudget(
        "gpu", dim=128, n_layers=2, n_heads=4, device="cuda", dtype="bfloat16", threads=4, jobs=4,
        tasks={
            "mqar": TaskBudget((4096, 16384), 3000, 65536, 1, (1e-3,), 500, min_batch=4,
                               options={"vocab_size": 8192, "eval_sequences": 128},
                               target=0.995),
            "lm-ptb": TaskBudget((4096, 16384), 1000, 65536, 1, (1e-3,), 500, min_batch=2),
        },
        description="one lent H200 in one 8-minute run, bf16, 4 cells at a time (sized by "
        "estimate: not yet run)",
    ),
}  # fmt: skip


# ---------------------------------------------------------------------------------- cells


def cell_id(task: str, mechanism: str, length: int, lr: float, seed: int) -> str:
    return f"{task}/{mechanism}/T{length}/lr{lr:g}/s{seed}"


def _model_overrides(
    budget: QualityBudget, task: str, mechanism: str, length: int
) -> tuple[str, dict[str, Any]]:
    """(registered base name, config overrides) of a cell's model."""
    mech = MECHANISMS[mechanism]
    common = {"dim": budget.dim, "n_layers": budget.n_layers, "n_heads": budget.n_heads,
              "dropout": 0.0}  # fmt: skip
    kind = TASKS[task][0]
    if mech.family == "vanilla":
        over = {
            **common,
            "ffn_dim": 4 * budget.dim,
            "attention": mech.attention(task, length),
            "init": "lecun",
        }
        if mech.name == "lsra":
            over["attention"] = {**over["attention"], "attn_heads": budget.n_heads,
                                 "conv_heads": budget.n_heads}  # fmt: skip
        over.update(dict(mech.model))
        return "vanilla-tiny", over
    if mech.family in ("xl", "compressive"):
        # the same attention context as the others' T: segments of S (T/2 unless the budget
        # names one) with T - S of memory (Compressive: half of it memory, half compressed
        # slots, which reach three times as far back)
        seg = budget.tasks[task].segment or length // 2
        if not 0 < seg < length:
            raise ValueError(f"{task}: the recurrent segment must lie in (0, {length}), got {seg}")
        over = {**common, "ffn_dim": 4 * budget.dim, "seq_len": seg, "mem_len": length - seg}
        if mech.family == "compressive":
            over.update(mem_len=(length - seg) // 2, cmem_len=(length - seg) // 2)
        return f"{mech.family}-tiny", over
    if mech.family == "funnel":
        return "funnel-tiny", {**common, "ffn_dim": 4 * budget.dim, "n_layers": budget.n_layers}
    raise ValueError(f"unknown family {mech.family!r} ({kind})")


def _task_setup(cell: dict[str, Any]) -> tuple[Any, torch.nn.Module]:
    """Build the task and the model of a cell (in the cell's process, or on meta to check)."""
    from ..config import replace_config
    from ..registry import build_model, get_config

    task_name, length, seed = cell["task"], int(cell["length"]), int(cell["seed"])
    torch.manual_seed(seed)  # the weights are a function of the seed, as the data is
    opts = dict(cell.get("task_options") or {})
    base, over = cell["model"], dict(cell["overrides"])
    batch = int(cell["batch"])
    if task_name == "mqar":
        from ..tasks.mqar import MQARTask

        task = MQARTask(seq_len=length, batch_size=batch, seed=seed, **opts)
        over.update(vocab_size=task.vocab_size, seq_len=max(length, 1))
    elif task_name == "duplication":
        from ..tasks.duplication import DuplicationTask

        task = DuplicationTask(seq_len=length, batch_size=batch, seed=seed, **opts)
        over.update(vocab_size=task.vocab_size, seq_len=length - 1)
    elif task_name == "listops":
        from ..tasks.listops import ListOpsTask, build_listops_model

        task = ListOpsTask(max_len=length, batch_size=batch, seed=seed, **opts)
        over.update(vocab_size=task.vocab_size, seq_len=task.model_len, causal=False)
        config = get_config(base, **over)
        return task, build_listops_model(config)
    else:
        from ..data import load_corpus
        from ..tasks.lm import LMTask

        rel, fmt = LM_DATA[task_name]
        corpus = load_corpus(Path(cell["data"]) / rel, fmt)
        task = LMTask(
            corpus,
            batch_size=batch,
            seq_len=int(over.get("seq_len", length)),
            seed=seed,
            # the curve's evaluations may score a prefix of the split (``curve_eval_tokens``);
            # the final scores use ``eval_tokens`` (None: the whole split)
            eval_tokens=opts.get("curve_eval_tokens", opts.get("eval_tokens")),
        )
        over.update(vocab_size=corpus.vocab.size)
        if "seq_len" not in over:
            over["seq_len"] = length
    config = get_config(base, **over)
    if "causal" in type(config).field_names() and not config.causal:
        config = replace_config(config, causal=True)
    return task, build_model(config)


def check_cell(cell: dict[str, Any]) -> None:
    """Build the cell's config and model on the meta device; raise what building raises."""
    if cell["task"].startswith("lm"):
        from ..registry import build_model, get_config

        over = {**cell["overrides"], "vocab_size": 256}
        over.setdefault("seq_len", int(cell["length"]))
        with torch.device("meta"):
            build_model(get_config(cell["model"], **over))
        return
    with torch.device("meta"):
        _task_setup(cell)


def _hash_evals(
    model: torch.nn.Module, task: Any, length: int, metric: str = "accuracy", device: str = "cpu"
) -> dict[str, Any]:
    """LSH cells of the causal tasks (duplication as the Reformer paper's Table 2, MQAR, the
    LM; not ListOps, whose classifier wraps the model): the trained weights scored on the test
    split with 1, 2, 4, 8 hashes and with full (shared-QK) attention: one hash and one chunk
    spanning the whole sequence, so every earlier key is visible whatever bucket it falls in.
    This separates what hashing costs (the trained model scored with every key visible) from
    what the model learned."""
    from ..config import replace_config
    from ..models.reformer import reconfigure
    from ..registry import build_model

    out: dict[str, Any] = {}
    for n in (1, 2, 4, 8):
        scored = reconfigure(model, n_hashes=n)
        out[f"hashes_{n}"] = task.evaluate(scored, "test", device=device)[metric]
    att = model.config.attention
    full_chunk = 1 << max(2, math.ceil(math.log2(length)))
    full = dataclasses.replace(att, n_hashes=1, n_buckets=2, chunk_len=full_chunk)
    new = build_model(replace_config(model.config, attention=full))
    new.load_state_dict(model.state_dict(), strict=True)
    new.to(device).eval()
    out["full"] = task.evaluate(new, "test", device=device)[metric]
    return out


def run_quality_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Train and score one cell (in its own process); returns the measured part of its record.
    A non-finite loss ends the cell with ``status="diverged"`` and what was measured before."""
    from ..train import TrainConfig, train
    from ..train.optimizer import own_clip_parameters

    torch.set_num_threads(int(cell["threads"]))
    device = cell["device"]
    task, model = _task_setup(cell)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    run_dir = Path(cell["run_dir"])
    resume = str(run_dir) if (run_dir / "latest").exists() else None
    steps = int(cell["steps"])
    config = TrainConfig(
        steps=steps,
        lr=float(cell["lr"]),
        warmup=min(int(cell["warmup"]), steps // 10 or 1),
        weight_decay=0.0,
        betas=(0.9, 0.98),
        clip=1.0,
        schedule="constant",
        seed=int(cell["seed"]),
        device=device,
        bf16=cell.get("dtype") == "bfloat16",
        eval_every=int(cell["eval_every"]),
        checkpoint_every=max(int(cell["eval_every"]), steps // 4),
        keep_checkpoints=1,
        out_dir=str(run_dir),
        resume=resume,
        progress=False,
        log_every=1,
    )
    model.to(device)
    status, error = "ok", None
    stop = _TargetStop(task, TASKS[cell["task"]][1], cell.get("target"), TASKS[cell["task"]][2])
    t0 = time.perf_counter()
    try:
        history = train(model, stop.task, config, stop=stop)
    except FloatingPointError as e:
        status, error, history = "diverged", str(e).splitlines()[0][:300], None
    train_s = time.perf_counter() - t0
    rec: dict[str, Any] = {"status": status, "params": params, "train_s": train_s}
    apart = {id(p) for p in own_clip_parameters(model)}
    if apart:  # which parameters the recipe's clip treated as a group of their own
        rec["clipped_apart"] = [n for n, p in model.named_parameters() if id(p) in apart]
    curve, step_s = _read_curve(run_dir / "metrics.jsonl", TASKS[cell["task"]][1])
    rec["curve"] = curve
    rec["step_s_median"] = statistics.median(step_s) if step_s else None
    rec["steps_done"] = history.step if history is not None else (curve[-1][0] if curve else 0)
    if status == "diverged":  # recorded as such (the table shows it), not an error
        return {**rec, "diverged": error}
    model.eval()
    metric = TASKS[cell["task"]][1]
    if "curve_eval_tokens" in (cell.get("task_options") or {}):
        task.eval_tokens = cell["task_options"].get("eval_tokens")
    for split in ("valid", "test"):
        result = task.evaluate(model, split, device=device)
        rec[split] = result[metric]
        rec[f"{split}_all"] = {k: v for k, v in result.items() if isinstance(v, int | float)}
    # the causal tasks, whose model is the LM itself (ListOps' classifier wraps it)
    if cell["mechanism"] == "lsh" and TASKS[cell["task"]][0] != "bidirectional":
        rec["hash_evals"] = _hash_evals(model, task, int(cell["length"]), metric, device)
    return rec


class _TargetStop:
    """A graceful-stop request for :func:`~effiformer.train.train` that turns true once a
    validation score reaches ``target`` (``stop.task`` is the task with its ``evaluate``
    watched)."""

    def __init__(self, task: Any, metric: str, target: float | None, higher: bool) -> None:
        self.requested = False
        self.task = task
        if target is None:
            return
        evaluate = task.evaluate

        def watched(*args: Any, **kwargs: Any) -> dict[str, Any]:
            result = evaluate(*args, **kwargs)
            value = result.get(metric)
            if value is not None and (value >= target if higher else value <= target):
                self.requested = True
            return result

        task.evaluate = watched


def _read_curve(path: Path, metric: str) -> tuple[list[list[float]], list[float]]:
    """``[[step, seconds of training so far, valid metric], ...]`` and the step times."""
    curve: list[list[float]] = []
    step_s: list[float] = []
    if not path.is_file():
        return curve, step_s
    elapsed = 0.0
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step_s" in r:
            step_s.append(float(r["step_s"]))
            elapsed += float(r["step_s"])
        key = f"val_{metric}"
        if key in r:
            curve.append([int(r["step"]), round(elapsed, 3), float(r[key])])
    return curve, step_s


# ---------------------------------------------------------------------------------- planning


class QualityInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_quality`; ``done`` cells are in ``results.jsonl``."""

    def __init__(self, done: int, total: int, out: Path) -> None:
        super().__init__(f"interrupted after {done} of {total} cells")
        self.done, self.total, self.out = done, total, out


def _resolve(items: Sequence[str] | None, known: Iterable[str], what: str) -> list[str]:
    known = list(known)
    if not items:
        return known
    out = []
    for it in items:
        if it not in known:
            raise ValueError(
                f"unknown {what} {it!r}; known (closest first): {', '.join(closest(it, known))}"
            )
        if it not in out:
            out.append(it)
    return out


def plan_cells(
    budget: QualityBudget,
    tasks: Sequence[str] | None = None,
    mechanisms: Sequence[str] | None = None,
    *,
    lengths: Sequence[int] | None = None,
    seeds: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """The (task, mechanism) pairs to run, and notes on the pairs left out because the
    mechanism does not fit the task. Errors (one line each): an unknown task or mechanism, a
    task the budget has no share for, a mechanism that fits none of the tasks, a length a
    mechanism cannot take (its config or model fails to build)."""
    task_names = _resolve(tasks, [t for t in TASKS if t in budget.tasks] if not tasks else TASKS,
                          "task")  # fmt: skip
    for t in task_names:
        if t not in budget.tasks:
            raise ValueError(
                f"the {budget.name!r} budget has no share for task {t!r} (it has: "
                f"{', '.join(budget.tasks)})"
            )
    mech_names = _resolve(mechanisms, MECHANISMS, "mechanism")
    if not mechanisms:
        mech_names = [m for m in mech_names if MECHANISMS[m].default]
    pairs, notes = [], []
    for m in mech_names:
        fitting = [t for t in task_names if fits(m, t)]
        if mechanisms and not fitting:
            kinds = " or ".join(MECHANISMS[m].kinds)
            raise ValueError(
                f"mechanism {m!r} fits none of the tasks {', '.join(task_names)} (it takes "
                f"{kinds} tasks)"
            )
        for t in task_names:
            if fits(m, t):
                pairs.append((t, m))
            elif mechanisms:
                notes.append(f"{m} is not run on {t} ({TASKS[t][0]} task; {m} takes "
                             f"{' or '.join(MECHANISMS[m].kinds)})")  # fmt: skip
    if seeds is not None and seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    for t, m in pairs:
        for length in lengths or budget.tasks[t].lengths:
            if t == "duplication" and length % 2:
                raise ValueError(f"duplication needs an even length (0 w 0 w), got {length}")
            cell = _make_cell(budget, t, m, length, lr or 1e-3, 0, steps, data=None)
            try:
                check_cell(cell)
            except Exception as e:  # noqa: BLE001 - any build failure is the user's answer
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ValueError(f"{m} cannot run {t} at length {length}: {msg}") from None
    return [(t, m) for t, m in pairs], notes


def _make_cell(
    budget: QualityBudget,
    task: str,
    mechanism: str,
    length: int,
    lr: float,
    seed: int,
    steps: int | None,
    *,
    data: str | None,
    out: Path | None = None,
    phase: str = "main",
) -> dict[str, Any]:
    tb = budget.tasks[task]
    model, over = _model_overrides(budget, task, mechanism, length)
    cid = cell_id(task, mechanism, length, lr, seed)
    # recurrent families train on segments shorter than T: as many more rows, the same tokens
    segment = int(over.get("seq_len", length)) if TASKS[task][0] == "lm" else length
    return {
        "kind": "quality",
        "cell": cid,
        "phase": phase,
        "task": task,
        "mechanism": mechanism,
        "length": length,
        "seed": seed,
        "lr": lr,
        "steps": steps or tb.steps_at(length),
        "batch": tb.batch(segment),
        "warmup": tb.warmup,
        "eval_every": min(tb.eval_every, steps or tb.steps_at(length)),
        "target": tb.target,
        "task_options": dict(tb.options),
        "model": model,
        "overrides": over,
        "settings": mechanism_settings(mechanism, task, length),
        "device": budget.device,
        "dtype": budget.dtype,
        "threads": budget.threads,
        "data": data,
        "run_dir": str(out / "cells" / cid.replace("/", "_")) if out else "",
    }


@torch.no_grad()
def module_inputs(
    model: torch.nn.Module, x: torch.Tensor, modules: Sequence[torch.nn.Module]
) -> list[tuple[torch.nn.Module, torch.Tensor, dict[str, Any]]]:
    """Run ``model`` once on ``x`` in eval mode and return, for every call of one of
    ``modules`` in the order the model makes them, ``(module, its first positional input, its
    keyword arguments)``: what the scripts that score cells again read to recompute a part's
    weights or split its output (``benchmarks/``)."""
    seen: list[tuple[torch.nn.Module, torch.Tensor, dict[str, Any]]] = []

    def pre(mod, args, kwargs):
        seen.append((mod, args[0], dict(kwargs)))

    hooks = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in modules]
    try:
        model.eval()
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def recorded_cells(out: str | Path, cells: Sequence[str]) -> list[tuple[dict[str, Any], Path]]:
    """``(record, run folder)`` of each of ``cells`` in the quality run folder ``out``, for the
    scripts that score trained cells again from their last checkpoint (``benchmarks/``). Every
    cell is checked before any is returned; :class:`ValueError` names the first problem (no
    ``results.jsonl``, no record of a cell, no checkpoint of it)."""
    out = Path(out)
    if not (out / RESULTS).is_file():
        raise ValueError(f"{out / RESULTS} does not exist")
    recs = _read_results(out / RESULTS)
    found = []
    for cid in cells:
        if cid not in recs:
            raise ValueError(f"no record of {cid} in {out}")
        run = out / "cells" / cid.replace("/", "_")
        if not (run / "latest").exists():
            raise ValueError(f"no checkpoint of {cid} in {run}")
        found.append((recs[cid], run))
    return found


def _read_results(path: Path) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill: that cell runs again
            if "cell" in r:
                done[r["cell"]] = r
    return done


def _chosen_rate(
    done: dict[str, dict[str, Any]],
    task: str,
    mechanism: str,
    length: int,
    rates: Sequence[float],
    target: float | None,
) -> float | None:
    """The rate every main cell of (``task``, ``mechanism``) trains at, the one rule that
    :func:`run_quality` runs and :func:`quality_plan` reports: the only rate when there is no
    sweep; else the best of the sweep's seed-0 cells at ``length`` (:func:`_best_lr`), the
    middle rate when none of them is usable (all diverged or failed), and ``None`` while a sweep
    cell is not recorded yet."""
    if len(rates) == 1:
        return rates[0]
    recs = [done.get(cell_id(task, mechanism, length, r, 0)) for r in rates]
    if any(r is None for r in recs):
        return None
    best = _best_lr([r for r in recs if r], TASKS[task][2], target)
    return rates[len(rates) // 2] if best is None else best


def _best_lr(
    records: list[dict[str, Any]], higher: bool, target: float | None = None
) -> float | None:
    """The sweep's best rate: the best validation metric; cells that reached the ``target``
    (and stopped there) count as equal, and among them the one that took the fewest steps wins
    (the first in the list on a full tie)."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("valid") is not None]
    if not ok:
        return None

    def key(r: dict[str, Any]) -> tuple[float, int]:
        v = r["valid"] if higher else -r["valid"]
        if target is not None and higher:
            v = min(v, target)
        return (v, -int(r.get("steps_done") or 0))

    return max(ok, key=key)["lr"]


TIMING = "timing.json"
#: steps a timing cell runs, and how many of its first steps it leaves out of the median
TIMING_STEPS, TIMING_SKIP = 12, 4


#: the metric a timing cell's evaluation reports (nothing is evaluated)
TIMING_METRIC = "timing_only"


class NoEval:
    """A task whose ``evaluate`` returns nothing measured: a timing cell's trainer then spends
    its time on training steps only (the trainer evaluates at the end of every run)."""

    def __init__(self, task: Any) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def evaluate(self, model: Any, split: str = "valid", **kw: Any) -> dict[str, float]:
        return {TIMING_METRIC: float("nan")}


def run_quality_timing(cell: dict[str, Any]) -> dict[str, Any]:
    """Time a cell's training step (in its own process, the cell's threads, shapes and recipe):
    ``TIMING_STEPS`` steps through the trainer, the median ``step_s`` of all but the first
    ``TIMING_SKIP``, with the machine's load average when measured."""
    from ..train import TrainConfig, train

    torch.set_num_threads(int(cell["threads"]))
    task, model = _task_setup(cell)
    config = TrainConfig(
        steps=TIMING_STEPS, lr=float(cell["lr"]), warmup=1, weight_decay=0.0, betas=(0.9, 0.98),
        clip=1.0, schedule="constant", seed=int(cell["seed"]), device=cell["device"],
        bf16=cell.get("dtype") == "bfloat16", eval_every=None, checkpoint_every=None,
        out_dir=None, progress=False, log_every=1,
    )  # fmt: skip
    model.to(cell["device"])
    history = train(model, NoEval(task), config)
    times = [r["step_s"] for r in history.train if "step_s" in r][TIMING_SKIP:]
    return {
        "step_s": statistics.median(times),
        "steps_timed": len(times),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_count": os.cpu_count(),
    }


def timing_key(task: str, mechanism: str, length: int) -> str:
    return f"{task}/{mechanism}/T{length}"


def allocate_steps(
    step_s: dict[str, float], seconds: float, *, min_steps: int = 1
) -> dict[str, int]:
    """Equal compute from a timing table: each key's step time -> the whole steps that fit
    ``seconds`` of that (quiet-machine) time, at least ``min_steps``."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"the time budget must be a positive number of seconds, got {seconds!r}")
    out = {}
    for key, t in step_s.items():
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"{key}: a step time must be a positive number, got {t!r}")
        # floor of the ratio, forgiving the last bit (900 // 0.05 is 17999.0 in floating point)
        out[key] = max(min_steps, math.floor(seconds / t * (1 + 1e-12)))
    return out


def loaded(timing: dict[str, Any], threshold: float = 0.5) -> bool:
    """Whether a timing was measured on a loaded machine: a 1-minute load average above
    ``threshold`` of the cores besides the timing process's own threads."""
    load, cores = timing.get("loadavg"), timing.get("cpu_count") or 1
    return bool(load) and load[0] > timing.get("threads", 1) + threshold * cores


def run_quality(
    tasks: Sequence[str] | None = None,
    mechanisms: Sequence[str] | None = None,
    *,
    budget: str | QualityBudget = "cpu",
    out: str | Path = "quality-out",
    lengths: Sequence[int] | None = None,
    seeds: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
    jobs: int | None = None,
    threads: int | None = None,
    data: str | Path | None = None,
    force: bool = False,
    plot: bool = True,
    progress: bool = True,
    cell_timeout: float | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    equal_time: float | None = None,
) -> list[dict[str, Any]]:
    """Plan, run (resuming ``out``), report; returns every record of the plan (see the module
    docstring). ``lr`` skips the sweep and trains every cell at that rate. ``equal_time``:
    equal compute instead of equal steps: each (task, mechanism, length) is first timed, one at
    a time (``OUT/timing.json``, kept for resuming; the load average is recorded with each
    timing and a loaded machine is warned about), then trains the steps that fit that many
    seconds of its measured step time (:func:`allocate_steps`)."""
    from .harness import _run_cell_process, environment

    if isinstance(budget, str) and budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; budgets: {', '.join(BUDGETS)}")
    b = BUDGETS[budget] if isinstance(budget, str) else budget
    if jobs is not None or threads is not None:
        b = dataclasses.replace(b, jobs=jobs or b.jobs, threads=threads or b.threads)
    pairs, notes = plan_cells(b, tasks, mechanisms, lengths=lengths, seeds=seeds, steps=steps,
                              lr=lr)  # fmt: skip
    for n in notes:
        logger.warning("%s", n)
    lm_tasks = sorted({t for t, _ in pairs if TASKS[t][0] == "lm"})
    data_dir = _data_dir(data, lm_tasks)
    out = Path(out)
    # what a cell's result depends on besides its id (task, mechanism, length, lr, seed): the
    # budget's model and each task's steps, batch and options; other selections may differ
    # between runs of one folder (more seeds, more lengths, a sweep after a fixed rate)
    budget_dict = b.to_dict()
    for k in ("jobs", "threads", "description"):
        budget_dict.pop(k)
    manifest = {"budget": budget_dict, "steps": steps}
    if equal_time is not None:
        if steps is not None:
            raise ValueError("give steps or equal_time, not both")
        allocate_steps({"check": 1.0}, equal_time)  # refuses a bad budget before anything runs
        manifest["equal_time"] = equal_time
    manifest = _check_manifest(out, manifest, force, sorted({t for t, _ in pairs}))
    out.mkdir(parents=True, exist_ok=True)
    if force:
        import shutil

        for name in (RESULTS, TABLE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "cells", ignore_errors=True)  # their checkpoints belong to the old plan
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    results = out / RESULTS
    done = _read_results(results)
    env = environment(torch.device(b.device if b.device != "cuda" or torch.cuda.is_available()
                                   else "cpu"), b.dtype, b.threads, peak=False)  # fmt: skip
    lock = threading.Lock()
    interrupted = threading.Event()

    def report() -> None:
        # from the file, not this run's memory: another run on the same folder (other rows, in
        # another process) appends its cells there too, and the table shows every cell
        _report(out, {**done, **_read_results(results)}, plot)

    def execute(cells: list[dict[str, Any]], label: str) -> None:
        todo = [c for c in cells if c["cell"] not in done]
        if not todo:
            return
        bar = _bar(len(todo), label, progress)
        with ThreadPoolExecutor(max_workers=max(1, b.jobs)) as pool:
            futures = {pool.submit(_one, c): c for c in todo}
            try:
                for fut in as_completed(futures):
                    c = futures[fut]
                    rec = fut.result()
                    if rec is None:
                        continue
                    with lock:
                        done[c["cell"]] = rec
                        with open(results, "a") as f:
                            f.write(json.dumps(rec, default=str) + "\n")
                        report()  # the table and plots follow every cell
                    if on_record is not None:
                        on_record(rec)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix_str(_short(rec))
            except KeyboardInterrupt:
                interrupted.set()
                for f in futures:
                    f.cancel()
                raise
            finally:
                if bar is not None:
                    bar.close()

    def _one(c: dict[str, Any]) -> dict[str, Any] | None:
        if interrupted.is_set():
            return None
        Path(c["run_dir"]).mkdir(parents=True, exist_ok=True)
        try:
            res = _run_cell_process(c, cell_timeout)
        except KeyboardInterrupt:
            interrupted.set()
            return None
        base = {k: c[k] for k in ("cell", "phase", "task", "mechanism", "length", "seed", "lr",
                                  "steps", "batch", "settings", "model", "overrides")}  # fmt: skip
        base.update(metric=TASKS[c["task"]][1], budget=b.name, env=env)
        if "equal_time" in c:  # the quiet step time the steps were allocated from
            base["equal_time"] = c["equal_time"]
        if "error" in res:
            return {**base, "status": "error", "error": res["error"]}
        return {**base, **res}

    alloc: dict[str, int] = {}
    timings: dict[str, Any] = {}
    if equal_time is not None:
        timings = _time_cells(b, pairs, lengths, lr, out, data_dir, cell_timeout, progress)
        alloc = allocate_steps({k: v["step_s"] for k, v in timings.items()}, equal_time)

    def cell_steps(t: str, m: str, length: int) -> int | None:
        return alloc.get(timing_key(t, m, length), steps)

    def make(t, m, length, r, s, phase="main"):
        c = _make_cell(b, t, m, length, r, s, cell_steps(t, m, length), data=data_dir, out=out,
                       phase=phase)  # fmt: skip
        if equal_time is not None:
            c["eval_every"] = max(1, c["steps"] // 10)
            c["equal_time"] = {
                "seconds": equal_time,
                "step_s_quiet": timings[timing_key(t, m, length)]["step_s"],
            }
        return c

    all_cells: list[dict[str, Any]] = []
    n_seeds = {t: seeds or b.tasks[t].seeds for t in {t for t, _ in pairs}}
    try:
        for t in dict.fromkeys(t for t, _ in pairs):
            tb = b.tasks[t]
            t_lengths = list(lengths or tb.lengths)
            mechs = [m for tt, m in pairs if tt == t]
            rates = (lr,) if lr is not None else tb.lrs
            sweep = []
            if len(rates) > 1:
                for m in mechs:
                    for r in rates:
                        sweep.append(make(t, m, t_lengths[0], r, 0, phase="sweep"))
                execute(sweep, f"{t}: learning-rate sweep")
                all_cells += sweep
            main = []
            for s in range(n_seeds[t]):
                for length in t_lengths:
                    for m in mechs:
                        best = _chosen_rate(done, t, m, t_lengths[0], rates, tb.target)
                        if best is None:  # a sweep cell not recorded (interrupted): never here
                            raise RuntimeError(f"{t}/{m}: the learning-rate sweep is unfinished")
                        main.append(make(t, m, length, best, s))
            main = [c for c in main if c["cell"] not in {x["cell"] for x in sweep}]
            execute(main, f"{t}: cells")
            all_cells += main
            report()
    except KeyboardInterrupt:
        report()
        finished = sum(c["cell"] in done for c in all_cells)
        raise QualityInterrupted(finished, len(all_cells), out) from None
    report()
    return [done[c["cell"]] for c in all_cells if c["cell"] in done]


def quality_plan(
    tasks: Sequence[str] | None = None,
    mechanisms: Sequence[str] | None = None,
    *,
    budget: str | QualityBudget = "cpu",
    out: str | Path = "quality-out",
    lengths: Sequence[int] | None = None,
    seeds: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
) -> list[dict[str, Any]]:
    """What :func:`run_quality` with these arguments would run, against what ``out`` holds,
    without running or writing anything: one row per (task, mechanism) with ``planned`` cells
    (the sweep's rates at the shortest length, then ``seeds`` x lengths at the best rate, the
    sweep's seed-0 cell counted once), ``recorded``, ``to_run`` and ``waiting`` (cells whose
    rate the unfinished sweep has not chosen yet), and ``estimate_s``: the cells left times
    the seconds per step of recorded cells of the same task, mechanism and length (their
    training time under whatever load they ran; an upper bound where the task stops at a
    target), ``None`` where no such cell is recorded (``unknown`` counts those cells)."""
    b = BUDGETS[budget] if isinstance(budget, str) else budget
    pairs, _ = plan_cells(b, tasks, mechanisms, lengths=lengths, seeds=seeds, steps=steps, lr=lr)
    order = list(dict.fromkeys(t for t, _ in pairs))
    pairs = sorted(pairs, key=lambda p: order.index(p[0]))  # by task, as run_quality runs them
    done = _read_results(Path(out) / RESULTS)
    per_step: dict[tuple[str, str, int], list[float]] = {}
    for r in done.values():
        if r.get("status") == "ok" and r.get("train_s") and r.get("steps_done"):
            key = (r["task"], r["mechanism"], int(r["length"]))
            per_step.setdefault(key, []).append(float(r["train_s"]) / int(r["steps_done"]))
    rows = []
    for t, m in pairs:
        tb = b.tasks[t]
        t_lengths = list(lengths or tb.lengths)
        rates = (lr,) if lr is not None else tb.lrs
        cells = []
        if len(rates) > 1:
            cells += [cell_id(t, m, t_lengths[0], r, 0) for r in rates]
        best = _chosen_rate(done, t, m, t_lengths[0], rates, tb.target)  # None: sweep unfinished
        planned = len(cells)
        waiting = 0
        left: list[int] = []  # the lengths of the cells left to run
        left += [t_lengths[0] for c in cells if c not in done]
        for s in range(seeds or tb.seeds):
            for length in t_lengths:
                if len(rates) > 1 and s == 0 and length == t_lengths[0]:
                    continue  # the sweep's cell at the best rate
                planned += 1
                if best is None:
                    waiting += 1
                    left.append(length)
                elif cell_id(t, m, length, best, s) in done:
                    cells.append(cell_id(t, m, length, best, s))
                else:
                    left.append(length)
        recorded = sum(c in done for c in cells)
        estimate, unknown = 0.0, 0
        for length in left:
            known = per_step.get((t, m, length))
            if known:
                estimate += statistics.fmean(known) * (steps or tb.steps_at(length))
            else:
                unknown += 1
        rows.append({
            "task": t, "mechanism": m, "planned": planned, "recorded": recorded,
            "to_run": planned - recorded - waiting, "waiting": waiting,
            "best_lr": best, "estimate_s": None if left and unknown == len(left) else estimate,
            "unknown": unknown,
        })  # fmt: skip
    return rows


def format_quality_plan(rows: list[dict[str, Any]]) -> str:
    """The plan rows as a markdown table with totals."""
    lines = [
        "| task | mechanism | planned | recorded | left | rate | left, cell-hours |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        left = r["to_run"] + r["waiting"]
        rate = "after the sweep" if r["best_lr"] is None else f"{r['best_lr']:g}"
        est = (
            "-" if not left else "?" if r["estimate_s"] is None else f"{r['estimate_s'] / 3600:.2f}"
        )
        if left and r["estimate_s"] is not None and r["unknown"]:
            est += f" (+{r['unknown']} unknown)"
        lines.append(f"| {r['task']} | {r['mechanism']} | {r['planned']} | {r['recorded']} | "
                     f"{left} | {rate} | {est} |")  # fmt: skip
    planned = sum(r["planned"] for r in rows)
    recorded = sum(r["recorded"] for r in rows)
    hours = sum(r["estimate_s"] or 0.0 for r in rows) / 3600
    unknown = sum(r["unknown"] for r in rows)
    lines.append("")
    lines.append(
        f"{recorded} of {planned} cells recorded; the {planned - recorded} left take about "
        f"{hours:.1f} cell-hours by the recorded cells' seconds per step"
        + (f", plus {unknown} cells with no recorded cell of their task, mechanism and length"
           if unknown else "")
        + " (one core each; the budget runs two at a time)"
    )  # fmt: skip
    return "\n".join(lines)


def _time_cells(
    b: QualityBudget,
    pairs: list[tuple[str, str]],
    lengths: Sequence[int] | None,
    lr: float | None,
    out: Path,
    data_dir: str | None,
    cell_timeout: float | None,
    progress: bool,
) -> dict[str, Any]:
    """Time every (task, mechanism, length) of the plan that ``OUT/timing.json`` lacks, one at a
    time (never two timing processes at once, whatever ``jobs`` is); returns the table."""
    from .harness import _run_cell_process

    path = out / TIMING
    table: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    todo = []
    for t, m in pairs:
        for length in lengths or b.tasks[t].lengths:
            key = timing_key(t, m, length)
            if key not in table:
                rate = lr if lr is not None else b.tasks[t].lrs[0]
                cell = _make_cell(b, t, m, length, rate, 0, TIMING_STEPS, data=data_dir, out=out)
                cell.update(
                    kind="quality-timing", run_dir=str(out / "timing" / key.replace("/", "_"))
                )
                todo.append((key, cell))
    bar = _bar(len(todo), "timing each step (one at a time)", progress)
    try:
        for key, cell in todo:
            Path(cell["run_dir"]).mkdir(parents=True, exist_ok=True)
            res = _run_cell_process(cell, cell_timeout)
            if "error" in res:
                raise ValueError(f"timing {key} failed: {res['error']}")
            table[key] = {**res, "threads": b.threads}
            path.write_text(json.dumps(table, indent=1) + "\n")
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    busy = sorted(k for k, v in table.items() if loaded(v))
    if busy:
        logger.warning(
            "%d step timing(s) were measured on a loaded machine (%s): equal-compute budgets "
            "from them are not comparable; delete %s and rerun on a quiet machine",
            len(busy), ", ".join(busy[:4]) + (" ..." if len(busy) > 4 else ""), path,
        )  # fmt: skip
    return table


def _short(rec: dict[str, Any]) -> str:
    if rec.get("status") != "ok":
        return f"{rec['cell']}: {rec.get('status')}"
    return f"{rec['cell']}: {rec['metric']} {rec['test']:.3f}"


def _bar(total: int, label: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from ..progress import progress_bar

    return progress_bar(total=total, desc=label, unit="cell")


def _data_dir(data: str | Path | None, lm_tasks: list[str]) -> str | None:
    if not lm_tasks:
        return None
    folder = data if data is not None else os.environ.get("EFFIFORMER_DATA")
    if folder is None:
        raise ValueError(
            f"{', '.join(lm_tasks)} need the data folder (holding ptb/ and tinyshakespeare/): "
            "pass --data DIR or set EFFIFORMER_DATA"
        )
    for t in lm_tasks:
        rel = LM_DATA[t][0]
        if not (Path(folder) / rel).exists():
            raise ValueError(f"{t} needs {Path(folder) / rel}, which does not exist")
    return str(Path(folder).resolve())


def _check_manifest(
    out: Path, manifest: dict[str, Any], force: bool, tasks: list[str]
) -> dict[str, Any]:
    """Refuse a folder whose saved plan differs from this run's where this run's cells depend
    on it: the model, the steps override, and the budgets of the ``tasks`` run now (a task
    the folder has not run yet, or another task's budget changed since, is no conflict).
    Returns the manifest to write: the saved one with this run's tasks set."""
    path = out / MANIFEST
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a folder")
    new = json.loads(json.dumps(manifest, default=str))
    if force or not path.is_file():
        if not force and (out / RESULTS).is_file():
            raise ValueError(
                f"{out} holds results.jsonl but no {MANIFEST} (not a quality run); choose "
                "another --out or pass --force to replace it"
            )
        return new
    old = json.loads(path.read_text())
    # a folder saved before a TaskBudget field existed lacks it: read it as the field's default
    from ..checkpoint import _field_defaults

    defaults = json.loads(json.dumps(_field_defaults(TaskBudget), default=str))
    old_tasks = {t: {**defaults, **v} if isinstance(v, dict) else v
                 for t, v in ((old.get("budget") or {}).get("tasks") or {}).items()}  # fmt: skip
    new_tasks = new["budget"]["tasks"]
    differ = [k for k in ("steps", "equal_time") if old.get(k) != new.get(k)]
    old_model = {k: v for k, v in (old.get("budget") or {}).items() if k != "tasks"}
    new_model = {k: v for k, v in new["budget"].items() if k != "tasks"}
    differ += sorted(f"budget.{k}" for k in set(old_model) | set(new_model)
                     if old_model.get(k) != new_model.get(k))  # fmt: skip
    differ += [f"{t}'s budget" for t in tasks if t in old_tasks and old_tasks[t] != new_tasks[t]]
    if differ:
        raise ValueError(
            f"{out} holds a quality run with another plan ({', '.join(differ)} differ); resume "
            "it with the same settings, choose another --out, or pass --force to start over"
        )
    merged = dict(old)
    merged["budget"] = {**old_model, "tasks": {**old_tasks, **{t: new_tasks[t] for t in tasks}}}
    return merged


# ---------------------------------------------------------------------------------- report


def _mean_spread(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def format_quality_table(records: list[dict[str, Any]]) -> str:
    """Markdown: per task, one row per mechanism, one column per length, ``mean ± half-range
    (n seeds)`` of the test metric; diverged and failed cells are counted in the cell."""
    main = [r for r in records if r.get("phase") != "sweep" or r.get("seed") == 0]
    out: list[str] = []
    for task in TASKS:
        recs = [r for r in main if r["task"] == task]
        if not recs:
            continue
        metric, higher = TASKS[task][1], TASKS[task][2]
        lengths = sorted({r["length"] for r in recs})
        # the registry's order, then any row it does not know (a record written by a newer
        # version into a folder this process reports on: shown, not dropped)
        mechs = list(dict.fromkeys([m for m in MECHANISMS if any(r["mechanism"] == m for r in recs)]
                                   + [r["mechanism"] for r in recs]))  # fmt: skip
        out.append(f"### {task}: {TASKS[task][3]} ({'higher' if higher else 'lower'} is better)")
        out.append("")
        head = "| mechanism | lr | " + " | ".join(f"T={n}" for n in lengths) + " | settings |"
        out.append(head)
        out.append("|" + "---|" * (len(lengths) + 3))
        for m in mechs:
            row = [m]
            lrs = sorted({c["lr"] for n in lengths for c in _pick(recs, m, n)})
            row.append(", ".join(f"{x:g}" for x in lrs) or "-")
            for n in lengths:
                cell = _pick(recs, m, n)
                row.append(_fmt_cell(cell, metric))
            own = [r for r in recs if r["mechanism"] == m]
            settings = max(own, key=lambda r: r["length"])["settings"]  # at its longest length
            row.append(_fmt_settings(settings, MECHANISMS[m].note if m in MECHANISMS else ""))
            out.append("| " + " | ".join(row) + " |")
        extra, other = _task_notes(task, recs), _other_rates(recs, mechs, lengths, metric)
        extra += [""] + other if extra and other else other
        if extra:
            out.append("")
            out.extend(extra)
        out.append("")
    return "\n".join(out)


def _pick(recs: list[dict[str, Any]], m: str, n: int) -> list[dict[str, Any]]:
    """The cells of (m, n) at their chosen rate: main cells and the sweep's (seed-0) cells
    alike, so a sweep run after main cells at a fixed rate (``--lr X``) competes with them.
    Where several rates ran, the row shows the rate the sweep's rule picks among their seed-0
    cells (the best validation score; reaching the target in fewer steps breaks ties)."""
    cells = [r for r in recs if r["mechanism"] == m and r["length"] == n]
    if not cells:
        return []
    rates = {r["lr"] for r in cells}
    if len(rates) > 1:
        first = [r for r in cells if r.get("seed") == 0] or cells
        best = _best_lr(first, TASKS[first[0]["task"]][2], _target_of(first[0]))
        cells = [r for r in cells if r["lr"] == best] if best is not None else cells[:1]
    return cells


def _target_of(rec: dict[str, Any]) -> float | None:
    """The validation target a record's cell stopped at: its budget's for the task (the
    records do not carry it), or the record's own ``target`` where one is given."""
    if "target" in rec:
        return rec["target"]
    budget = BUDGETS.get(rec.get("budget", ""))
    tb = budget.tasks.get(rec["task"]) if budget is not None else None
    return tb.target if tb is not None else None


def _other_rates(
    recs: list[dict[str, Any]], mechs: list[str], lengths: list[int], metric: str
) -> list[str]:
    """A line naming the cells (main or sweep) a row leaves out because another rate did
    better."""
    scale, unit = (100.0, "%") if metric == "accuracy" else (1.0, "")
    items = []
    for m in mechs:
        for n in lengths:
            shown = {id(r) for r in _pick(recs, m, n)}
            rest = [r for r in recs if r["mechanism"] == m and r["length"] == n
                    and id(r) not in shown]  # fmt: skip
            for lr in sorted({r["lr"] for r in rest}):
                vals = [r["test"] for r in rest if r["lr"] == lr and r.get("status") == "ok"]
                got = (
                    f"{scale * statistics.fmean(vals):.{1 if unit else 3}f}{unit}" if vals else "-"
                )
                items.append(f"{m} at T={n}, lr {lr:g}: {got} ({len(vals)})")
    if not items:
        return []
    return ["Other learning rates run for a row (test, mean (seeds); the row shows the rate with "
            "the best validation score): " + "; ".join(items) + "."]  # fmt: skip


def _fmt_cell(cells: list[dict[str, Any]], metric: str) -> str:
    if not cells:
        return "-"
    ok = [c["test"] for c in cells if c.get("status") == "ok"]
    bad = [c for c in cells if c.get("status") != "ok"]
    scale = 100.0 if metric == "accuracy" else 1.0
    unit = "%" if metric == "accuracy" else ""
    text = ""
    if ok:
        mean, spread = _mean_spread([v * scale for v in ok])
        digits = 1 if metric == "accuracy" else 3
        text = f"{mean:.{digits}f}{unit}"
        if len(ok) > 1:
            text += f" ± {spread:.{digits}f}"
        text += f" ({len(ok)})"
    if bad:
        kinds = sorted({c.get("status", "error") for c in bad})
        text += (" " if text else "") + f"[{len(bad)} {'/'.join(kinds)}]"
    return text


def _fmt_settings(settings: dict[str, Any] | None, note: str) -> str:
    if not settings:
        return note
    items = [f"{k}={v}" for k, v in settings.items() if k != "name"]
    return (", ".join(items) + "; " if items else "") + note


def _task_notes(task: str, recs: list[dict[str, Any]]) -> list[str]:
    lines = []
    if task == "listops":
        maj = [r["test_all"].get("majority_accuracy") for r in recs if r.get("test_all")]
        if maj:
            lines.append(f"Majority class of the test set: {100 * statistics.fmean(maj):.1f}%.")
    # the hash counts of the cells the row shows (its chosen rate), not of every rate swept
    hashed = [(m, n, [r["hash_evals"] for r in _pick(recs, m, n) if r.get("hash_evals")])
              for m in dict.fromkeys(r["mechanism"] for r in recs if r.get("hash_evals"))
              for n in sorted({r["length"] for r in recs if r["mechanism"] == m})]  # fmt: skip
    hashed = [(m, n, rs) for m, n, rs in hashed if rs]
    if hashed:
        bpc = TASKS[task][1] == "bpc"
        lines.append("LSH-trained models (2 hashes) evaluated with other hash counts and with "
                     f"full attention (test {'bpc' if bpc else 'accuracy'}, mean over the "
                     "row's seeds, at its rate):")  # fmt: skip
        lines.append("")
        named = len({m for m, _, _ in hashed}) > 1
        lines.append(f"| {'row, ' if named else ''}T | 1 hash | 2 | 4 | 8 | full |")
        lines.append("|---|---|---|---|---|---|")
        for m, n, rs in hashed:
            cols = [statistics.fmean(h[k] for h in rs) for k in
                    ("hashes_1", "hashes_2", "hashes_4", "hashes_8", "full")]  # fmt: skip
            cells = [f"{c:.3f}" if bpc else f"{100 * c:.1f}%" for c in cols]
            lines.append(f"| {f'{m}, ' if named else ''}{n} ({len(rs)}) | " + " | ".join(cells)
                         + " |")  # fmt: skip
    if task == "mqar":
        lines.append("Key-value pairs: T/16 (4 at 64 ... 64 at 1,024); chance = 1/128.")
    return lines


def _report(out: Path, done: dict[str, dict[str, Any]], plot: bool) -> None:
    records = list(done.values())
    if not records:
        return
    (out / TABLE).write_text(format_quality_table(records) + "\n")
    if plot:
        try:
            plot_quality(records, out)
        except ImportError:
            logger.warning("matplotlib is not installed: no plots")


def plot_quality(records: list[dict[str, Any]], out: Path) -> list[Path]:
    """``mqar.png`` (test accuracy against length, one line per mechanism, seeds' range as error
    bars) and ``lm.png`` (validation bpc against step and against training seconds, per LM task,
    one line per mechanism, seed 0 at the chosen rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    mq = [r for r in records if r["task"] == "mqar" and r.get("status") == "ok"]
    if mq:
        fig, ax = plt.subplots(figsize=(7, 4))
        for m in MECHANISMS:
            pts = []
            for n in sorted({r["length"] for r in mq if r["mechanism"] == m}):
                vals = [r["test"] for r in _pick(mq, m, n) if r.get("status") == "ok"]
                if vals:
                    pts.append((n, statistics.fmean(vals), min(vals), max(vals)))
            if pts:
                xs, ys, lo, hi = zip(*pts, strict=True)
                err = [[y - a for y, a in zip(ys, lo, strict=True)],
                       [b - y for y, b in zip(ys, hi, strict=True)]]  # fmt: skip
                ax.errorbar(xs, [100 * y for y in ys], yerr=[[100 * e for e in err[0]],
                            [100 * e for e in err[1]]], marker="o", capsize=3, label=m)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens); key-value pairs = length / 16")
        ax.set_ylabel("test accuracy on queried values (%)")
        ax.set_ylim(-2, 102)
        ax.set_title("MQAR: recall against sequence length")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = out / "mqar.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    lm = [r for r in records if TASKS[r["task"]][0] == "lm" and r.get("curve")]
    lm_tasks = [t for t in TASKS if any(r["task"] == t for r in lm)]
    if lm_tasks:
        fig, axes = plt.subplots(len(lm_tasks), 2, figsize=(10, 3.6 * len(lm_tasks)),
                                 squeeze=False)  # fmt: skip
        for i, t in enumerate(lm_tasks):
            for m in MECHANISMS:
                cand = [r for r in lm if r["task"] == t and r["mechanism"] == m
                        and r["seed"] == 0 and r["phase"] == "main"]  # fmt: skip
                cand = cand or [r for r in lm if r["task"] == t and r["mechanism"] == m]
                if not cand:
                    continue
                r = cand[0]
                steps_, secs, vals = zip(*r["curve"], strict=True)
                quiet = (r.get("equal_time") or {}).get("step_s_quiet")
                if quiet is not None:  # equal compute: the quiet-machine estimate
                    secs = tuple(st * quiet for st in steps_)
                axes[i][0].plot(steps_, vals, label=m)
                axes[i][1].plot(secs, vals, label=m)
            axes[i][0].set_xlabel("optimizer step")
            timed = any((r.get("equal_time") or {}).get("step_s_quiet") for r in lm)
            axes[i][1].set_xlabel(
                "estimated quiet seconds (step x the step time measured alone)"
                if timed
                else "training seconds (sum of step times; see docs/quality.md)"
            )
            for ax in axes[i]:
                ax.set_ylabel(f"{t}: validation bpc")
            axes[i][0].legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = out / "lm.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------- diagnostics


def mqar_reach(model: torch.nn.Module, task: Any, *, sequences: int = 8) -> dict[str, float]:
    """Whether each MQAR query *can* see its answer: the fraction of queries whose output logit
    for the right value has a non-zero gradient with respect to the input embedding at the
    pair's value position (``reach_value``) and at its key position (``reach_key``), over the
    first ``sequences`` test sequences. Mechanism-agnostic: a local window that ends before the
    pair gives exactly 0, an LSH bucket or a routing cluster that separates them too. A
    mechanism's accuracy cannot exceed what it reaches (up to guessing among values)."""
    from ..models.base import IGNORE_INDEX

    was = model.training
    model.eval()
    xs, ys = task.split("test")
    xs, ys = xs[:sequences], ys[:sequences]
    n = task.n_pairs
    captured: dict[str, torch.Tensor] = {}

    def keep(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.detach().requires_grad_(True)
        captured["emb"] = output
        return output

    handle = model.embed.register_forward_hook(keep)
    hits_v = hits_k = total = 0
    try:
        with torch.random.fork_rng():
            torch.manual_seed(task.eval_seed)
            for r in range(xs.shape[0]):
                x, y = xs[r : r + 1], ys[r : r + 1]
                keys = x[0, 0 : 2 * n : 2].tolist()
                for pos in (y[0] != IGNORE_INDEX).nonzero().flatten().tolist():
                    logits = model(x).logits  # (1, T, V)
                    emb = captured["emb"]
                    (g,) = torch.autograd.grad(logits[0, pos, int(y[0, pos])], emb)
                    i = keys.index(int(x[0, pos]))
                    strength = g[0].abs().amax(-1)  # (T,)
                    hits_k += bool(strength[2 * i] > 0)
                    hits_v += bool(strength[2 * i + 1] > 0)
                    total += 1
    finally:
        handle.remove()
        model.train(was)
    return {"reach_key": hits_k / total, "reach_value": hits_v / total, "queries": total}


def _last_layer_keep(model: torch.nn.Module, t: int) -> torch.Tensor | None:
    """(T, T) bool: which keys some head of the model's last layer attends from each query, for
    the mechanisms whose pattern is fixed by position (dense, local, sparse); None for the
    content-based ones (LSH buckets, routing clusters) and others."""
    config = model.config
    att = config.attention.for_layer(config.n_layers - 1, config.n_layers)
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    causal = j <= i
    if att.name in ("dense", "relative_xl"):
        return causal
    if att.name == "adaptive_span":  # keys closer than the widest learned reach of a head
        from .spans import span_report

        last = [r for r in span_report(model) if r["layer"] == config.n_layers - 1]
        reach = max(r["reach"] for r in last)
        return causal & ((i - j) < reach)
    if att.name == "local":
        w = att.window
        return causal & (j // w >= i // w - att.look_backward)
    if att.name == "sparse":
        from ..attention.sparse import pattern_mask

        return pattern_mask(att, t, config.n_heads, causal=True).any(0)
    return None


@torch.no_grad()
def mqar_breakdown(model: torch.nn.Module, task: Any, *, sequences: int = 128) -> dict[str, Any]:
    """MQAR test accuracy split by what the last layer can attend: ``direct`` (some head of the
    last layer can attend from the query to the pair's value position, for position-fixed
    patterns: dense, local, sparse) against ``indirect`` (the value must come through an earlier
    layer's mixing), and by the query-to-value distance (bins of powers of two). A mechanism
    at chance on indirect queries and right on direct ones cannot route the value in the depth
    it has."""
    from ..tasks.mqar import mqar_recall_positions

    was = model.training
    model.eval()
    xs, ys = task.split("test")
    xs, ys = xs[:sequences], ys[:sequences]
    keep = _last_layer_keep(model, xs.shape[1])
    rows: list[tuple[int, bool, bool | None]] = []
    try:
        with torch.random.fork_rng():
            torch.manual_seed(task.eval_seed)
            for s in range(0, xs.shape[0], task.eval_batch_size):
                x, y = xs[s : s + task.eval_batch_size], ys[s : s + task.eval_batch_size]
                pred = model(x).logits.argmax(-1)
                for r, pairs in enumerate(mqar_recall_positions(x, y, task.n_pairs)):
                    for q, v in pairs:
                        ok = bool(pred[r, q] == y[r, q])
                        rows.append((q - v, ok, None if keep is None else bool(keep[q, v])))
    finally:
        model.train(was)

    def acc(sel: list[tuple[int, bool, bool | None]]) -> float | None:
        return sum(ok for _, ok, _ in sel) / len(sel) if sel else None

    out: dict[str, Any] = {"accuracy": acc(rows), "queries": len(rows)}
    if keep is not None:
        direct = [r for r in rows if r[2]]
        indirect = [r for r in rows if not r[2]]
        out.update(direct_fraction=len(direct) / len(rows), direct_accuracy=acc(direct),
                   indirect_accuracy=acc(indirect))  # fmt: skip
    bins: dict[str, list[Any]] = {}
    for d, ok, k in rows:
        lo = 1 << max(0, int(math.log2(max(d, 1))))
        bins.setdefault(f"{lo}-{2 * lo - 1}", []).append((d, ok, k))
    out["by_distance"] = {b: {"accuracy": acc(v), "queries": len(v)} for b, v in
                          sorted(bins.items(), key=lambda kv: int(kv[0].split("-")[0]))}  # fmt: skip
    return out
