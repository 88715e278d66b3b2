"""``effiformer bench``: parse, call :func:`effiformer.bench.run_bench`, print the table.

Ctrl-C prints one line, keeps the finished cells in ``OUT/results.jsonl`` and exits 130."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import torch

from ..bench import (
    DECODING_RUNS,
    DECODING_WARMUP,
    DEFAULT_LENGTHS,
    DEFAULT_MECHANISMS,
    DEFAULT_NAMES,
    DEFAULT_REPEATS,
    DEFAULT_SET_LENGTHS,
    DEFAULT_WARMUP,
    DTYPES,
    MEMORY_METHODS,
    NOISY_SPREAD,
    TRAINING_PARTS,
    BenchInterrupted,
    format_references,
    format_summary,
    load_plugin,
    run_bench,
)
from .common import nonneg_int, positive_float, positive_int

#: Measured wall time of the default set (``effiformer bench``), see benchmarks/README.md.
DEFAULT_SET_TIME = "about 2.5 min on 2 idle CPU cores"

EPILOG = f"""examples:
  effiformer bench                      # the default set: {DEFAULT_SET_TIME}
  effiformer bench 'vanilla-*' --lengths 256 1024 4096 --batch 1 --part attention
  effiformer bench vanilla-small --set n_layers=2 --out bench-out --force
  effiformer bench routing-small --part attention --set attention.window=64 --lengths 1024
  effiformer bench transformer-base --part decoding --src-len 30 --beam 5
  effiformer bench --list-refs
  effiformer bench --part quality --budget smoke --out quality-smoke      # seconds
  effiformer bench --part quality --tasks mqar duplication --attention dense local lsh
  effiformer bench --part quality --budget cpu --data ../shared/data --out quality-cpu

An --out folder that already holds results is refused: --append adds to them, --force
replaces them. Ctrl-C stops the run and keeps the finished cells (exit 130)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time and memory of models or attention layers against sequence length",
        description="Benchmark registered models (or one attention layer of each) across "
        "lengths, or the decoding latency of encoder-decoder models (--part decoding).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "names", nargs="*", metavar="NAME",
        help="registered names or globs (default set: the attention mechanisms "
        f"{', '.join(DEFAULT_MECHANISMS)} side by side in {DEFAULT_NAMES[0]}, one layer and "
        f"the whole model, at {', '.join(map(str, DEFAULT_SET_LENGTHS))} tokens, then a "
        f"seconds-long quality smoke; {DEFAULT_SET_TIME})",
    )  # fmt: skip
    p.add_argument(
        "--lengths", nargs="+", type=positive_int, default=None, metavar="T",
        help=f"sequence lengths (default: {' '.join(map(str, DEFAULT_LENGTHS))}; the default "
        f"set: {' '.join(map(str, DEFAULT_SET_LENGTHS))})",
    )  # fmt: skip
    p.add_argument("--batch", type=positive_int, default=1, help="batch size (default: 1)")
    p.add_argument(
        "--part", choices=["model", "attention", "both", "decoding", "quality"], default=None,
        help="whole model, one attention layer (the model's first, as it calls it), both, decoding "
        "(encoder-decoder models: translate one sentence with beam search, HAT's latency), or "
        "quality (train every mechanism on the same tasks and score them: docs/quality.md) "
        "(default: model when names are given, both for the default set)",
    )  # fmt: skip
    q = p.add_argument_group("--part quality (docs/quality.md)")
    q.add_argument(
        "--tasks", nargs="+", default=None, metavar="TASK",
        help="tasks to run (default: every task of the budget): mqar, duplication, listops, "
        "lm-ptb, lm-shakespeare",
    )  # fmt: skip
    q.add_argument(
        "--attention", dest="mechanisms", nargs="+", default=None, metavar="MECHANISM",
        help="mechanisms (default: every one that fits each task); see --list-mechanisms",
    )  # fmt: skip
    q.add_argument(
        "--budget",
        default="cpu",
        help="smoke, cpu, cpu-long (long context at equal compute), cpu-deep or gpu (default: cpu)",
    )
    q.add_argument(
        "--seeds", type=positive_int, default=None, help="seeds per cell (default: budget's)"
    )
    q.add_argument(
        "--lr", type=positive_float, default=None,
        help="train every cell at this learning rate (default: sweep the budget's rates)",
    )  # fmt: skip
    q.add_argument("--jobs", type=positive_int, default=None, help="cells run in parallel")
    q.add_argument(
        "--equal-time", type=positive_float, default=None, metavar="SECONDS",
        help="equal compute instead of equal steps: time each mechanism's step alone first "
        "(OUT/timing.json; run on a quiet machine), then give each the steps that fit SECONDS "
        "of its own step time",
    )  # fmt: skip
    q.add_argument(
        "--data", default=None, metavar="DIR",
        help="folder holding ptb/ and tinyshakespeare/ for the lm-* tasks (default: "
        "$EFFIFORMER_DATA)",
    )  # fmt: skip
    q.add_argument(
        "--plan", action="store_true",
        help="print what this command would run against what --out holds (cells planned, "
        "recorded, left, and the cell-hours left by the recorded cells' step times) and exit "
        "without running or writing anything",
    )  # fmt: skip
    q.add_argument(
        "--list-mechanisms", action="store_true",
        help="list the quality suite's tasks, mechanisms and budgets and exit",
    )  # fmt: skip
    p.add_argument(
        "--src-len", dest="src_lens", nargs="+", type=positive_int, default=None, metavar="N",
        help="--part decoding: source lengths in tokens (default: 30)",
    )  # fmt: skip
    p.add_argument(
        "--beam", type=positive_int, default=None, help="--part decoding: beam size (default: 5)"
    )
    p.add_argument(
        "--steps", type=positive_int, default=None,
        help="--part decoding: decoder steps per sentence (default: the source length); "
        "--part quality: optimizer steps per cell (default: the budget's)",
    )  # fmt: skip
    p.add_argument(
        "--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
        help="time the training cells (--part model / attention) under torch.compile (default "
        "backend inductor; aot_eager traces without generating code); the first call, which "
        "compiles, is recorded as compile_s and is not among the timed steps",
    )  # fmt: skip
    p.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help="config overrides for every name, e.g. --set n_layers=2 dim=128",
    )  # fmt: skip
    p.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")
    p.add_argument(
        "--append", action="store_true",
        help="add this run's cells to the results already in --out",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace the results already in --out")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default: cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="default: float32")
    p.add_argument(
        "--threads", type=positive_int, default=None,
        help=f"intra-op threads per cell (default: torch's, here {torch.get_num_threads()})",
    )  # fmt: skip
    p.add_argument(
        "--repeats", type=positive_int, default=None,
        help=f"timed runs (median; default {DEFAULT_REPEATS}; --part decoding: {DECODING_RUNS}, "
        "trimmed mean)",
    )  # fmt: skip
    p.add_argument(
        "--warmup", type=nonneg_int, default=None,
        help=f"plain warm-up runs after the two FLOP-counting passes (default: {DEFAULT_WARMUP}; "
        f"--part decoding: {DECODING_WARMUP})",
    )  # fmt: skip
    p.add_argument(
        "--refs", nargs="+", default=None, metavar="PATTERN",
        help="reference rows to include, globs over their names, or 'none' (default: all "
        "that apply; sdpa only for the default set)",
    )  # fmt: skip
    p.add_argument("--refs-only", action="store_true", help="time only the reference rows")
    p.add_argument("--list-refs", action="store_true", help="list registered references and exit")
    p.add_argument(
        "--plugin", dest="plugins", action="append", default=[], metavar="MODULE_OR_FILE",
        help="import a module or .py file that registers references (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--max-memory-mib", type=positive_float, default=None,
        help="skip cells whose estimated memory exceeds this (default: available memory)",
    )  # fmt: skip
    p.add_argument(
        "--memory-method", choices=list(MEMORY_METHODS), default="auto",
        help="CPU peak memory: clear_refs (reset high-water mark) or maxrss (first-step "
        "getrusage difference); auto picks clear_refs when /proc allows (default)",
    )  # fmt: skip
    p.add_argument(
        "--cell-timeout", type=positive_float, default=1800.0,
        help="seconds before a cell is killed and reported as skipped (default: 1800)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-plot", action="store_true", help="do not draw bench.png")


def _check_part_flags(args: argparse.Namespace) -> str | None:
    quality_only = [f for f, v in (("--tasks", args.tasks), ("--attention", args.mechanisms),
                                   ("--seeds", args.seeds), ("--lr", args.lr),
                                   ("--jobs", args.jobs), ("--data", args.data),
                                   ("--equal-time", args.equal_time),
                                   ("--plan", args.plan or None))
                    if v is not None]  # fmt: skip
    if args.budget != "cpu":
        quality_only.append("--budget")
    if args.part != "quality" and quality_only:
        return f"{', '.join(quality_only)} only apply to --part quality"
    if args.part == "quality":
        others = [f for f, v in (("NAME", args.names), ("--src-len", args.src_lens),
                                 ("--beam", args.beam), ("--refs", args.refs),
                                 ("--batch", args.batch if args.batch != 1 else None))
                  if v]  # fmt: skip
        if others:
            return f"--part quality trains its own models; drop {', '.join(others)}"
        return None
    decoding = args.part == "decoding"
    if args.compile is not None and args.part not in (None, "model", "attention", "both"):
        return "--compile times training cells: use it with --part model, attention or both"
    if decoding and args.lengths is not None:
        return "--lengths does not apply to --part decoding; give the source lengths with --src-len"
    if decoding and args.batch != 1:
        return "--part decoding translates one sentence at a time (HAT's setting); drop --batch"
    if not decoding:
        given = [f for f, v in (("--src-len", args.src_lens), ("--beam", args.beam),
                                ("--steps", args.steps)) if v is not None]  # fmt: skip
        if given == ["--steps"]:
            return "--steps only applies to --part decoding and --part quality"
        if given:
            return f"{', '.join(given)} only apply to --part decoding"
    return None


def _interrupted(e: BenchInterrupted | None, out: str) -> int:
    # A second Ctrl-C cannot break the message; the handler comes back afterwards, so that a
    # caller of main() in the same process (and every process it starts later, which would
    # inherit an ignored SIGINT) still stops on Ctrl-C.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if e is None:
            print("\neffiformer bench: interrupted before any cell finished", file=sys.stderr)
        else:
            n = len(e.result.records)
            print(
                f"\neffiformer bench: interrupted after {n} of {e.total} cells; the finished "
                f"cells are in {e.result.results_path} (rerun with --append to add the rest)",
                file=sys.stderr,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
    return 130


def format_quality_catalogue() -> str:
    """The quality suite's tasks, mechanisms (with the task kinds they take) and budgets."""
    from ..bench.quality import BUDGETS, MECHANISMS, TASKS

    lines = ["tasks:"]
    lines += [f"  {n:<15} {k:<13} {d}" for n, (k, _, _, d) in TASKS.items()]
    lines.append("mechanisms:")
    lines += [f"  {m.name:<15} {'/'.join(m.kinds):<26} {m.note}" for m in MECHANISMS.values()]
    lines.append("budgets:")
    lines += [f"  {b.name:<15} {b.description}" for b in BUDGETS.values()]
    return "\n".join(lines)


def _run_quality(args: argparse.Namespace) -> int:
    from ..bench.quality import QualityInterrupted, format_quality_plan, quality_plan, run_quality

    out = args.out if args.out != "bench-out" else "quality-out"
    if args.plan:
        rows = quality_plan(args.tasks, args.mechanisms, budget=args.budget, out=out,
                            lengths=args.lengths, seeds=args.seeds, steps=args.steps,
                            lr=args.lr)  # fmt: skip
        print(format_quality_plan(rows))
        return 0
    try:
        records = run_quality(
            args.tasks,
            args.mechanisms,
            budget=args.budget,
            out=out,
            lengths=args.lengths,
            seeds=args.seeds,
            steps=args.steps,
            lr=args.lr,
            jobs=args.jobs,
            threads=args.threads,
            data=args.data,
            force=args.force,
            plot=not args.no_plot,
            progress=not args.no_progress,
            cell_timeout=None if args.cell_timeout == 1800.0 else args.cell_timeout,
            equal_time=args.equal_time,
        )
    except QualityInterrupted as e:
        print(
            f"\neffiformer bench: interrupted after {e.done} of {e.total} cells; rerun the same "
            f"command to resume ({e.out}/results.jsonl keeps the finished cells, unfinished ones "
            "continue from their checkpoints)",
            file=sys.stderr,
        )
        return 130
    table = Path(out) / "table.md"
    if table.is_file():
        print(table.read_text())
    bad = [r for r in records if r.get("status") != "ok"]
    print(f"wrote {out}/results.jsonl, {table}" + (" and the plots" if not args.no_plot else ""))
    if bad:
        print(f"{len(bad)} of {len(records)} cells did not finish cleanly (see the table: "
              "diverged or error)")  # fmt: skip
    return 0


def run(args: argparse.Namespace) -> int:
    """``effiformer bench``: run, print the table, say where the files are."""
    if args.list_refs:
        for plugin in args.plugins:
            load_plugin(plugin)
        print(format_references())
        return 0
    if args.list_mechanisms:
        print(format_quality_catalogue())
        return 0
    problem = _check_part_flags(args)
    if problem:
        raise ValueError(problem)
    if args.part == "quality":
        return _run_quality(args)
    parts = None
    if args.part is not None:
        parts = TRAINING_PARTS if args.part == "both" else (args.part,)
    kwargs = {}
    if args.src_lens is not None:
        kwargs["src_lens"] = args.src_lens
    if args.beam is not None:
        kwargs["beam"] = args.beam
    try:
        result = run_bench(
            args.names,
            lengths=(
                args.lengths
                if args.lengths is not None
                else (DEFAULT_LENGTHS if args.names else DEFAULT_SET_LENGTHS)
            ),
            batch=args.batch,
            parts=parts,
            overrides=args.overrides,
            device=args.device,
            dtype=args.dtype,
            threads=args.threads,
            repeats=args.repeats,
            warmup=args.warmup,
            out=args.out,
            append=args.append,
            force=args.force,
            refs=args.refs,
            refs_only=args.refs_only,
            plugins=args.plugins,
            max_memory_mib=args.max_memory_mib,
            memory_method=args.memory_method,
            cell_timeout=args.cell_timeout,
            progress=not args.no_progress,
            plot=not args.no_plot,
            steps=args.steps,
            compile=args.compile,
            **kwargs,
        )
    except BenchInterrupted as e:
        return _interrupted(e, args.out)
    except KeyboardInterrupt:
        return _interrupted(None, args.out)
    env = result.env
    peak = env.get("peak_tflops")
    load = env.get("loadavg")
    head = f"# torch {env['torch']} on {env['device_name']} ({env['device']}), {env['threads']} "
    head += f"threads, {env['dtype']}"
    if peak is not None:
        head += f", peak {peak:.3f} TFLOP/s"
        if env.get("peak_source") not in (None, "matmul"):
            head += f" ({env['peak_source']})"
    if load:
        head += f", load average {load[0]:.2f} before the run"
    head += f", git {env['git_sha']}"
    print(head)
    print(result.table)
    summary = format_summary(result.records)
    if summary:
        print("\nsummary (time and memory against dense attention in the same model):")
        print(summary)
    n_skipped = sum(r["status"] != "ok" for r in result.records)
    n_noisy = sum(bool(r.get("noisy")) for r in result.records)
    print(
        f"\nwrote {result.results_path}" + (f" and {result.plot_path}" if result.plot_path else "")
    )
    if n_skipped:
        print(f"{n_skipped} of {len(result.records)} cells skipped (see the note column)")
    cores = env.get("cpu_count") or 0
    if load and env["device"] == "cpu" and load[0] > max(0.5, cores - env["threads"]):
        print(
            f"the 1-minute load average was {load[0]:.2f} on {cores} cores before the run "
            f"({env['threads']} threads per cell): other processes were running, so every time "
            "above may be inflated"
        )
    if n_noisy:
        print(
            f"{n_noisy} of {len(result.records)} cells are noisy (timing samples spread over "
            f"{100 * NOISY_SPREAD:.0f}%): something else was probably running; their times are "
            "not to be trusted (rerun on a quiet machine, or with --threads 1)"
        )
    if not args.names and args.part is None:
        return _quality_smoke(args)
    return 0


def _quality_smoke(args: argparse.Namespace) -> int:
    """The default set's second half: the quality suite's smoke budget on MQAR for the same
    mechanisms (seconds: it proves each mechanism trains and is scored, not what it learns)."""
    from ..bench.quality import QualityInterrupted, run_quality

    out = Path(args.out) / "quality-smoke"
    print(f"\nquality smoke: MQAR at 64 tokens, 6 steps per mechanism ({out})")
    try:
        records = run_quality(
            ["mqar"], list(DEFAULT_MECHANISMS), budget="smoke", out=out, force=args.force,
            plot=False, progress=not args.no_progress,
        )  # fmt: skip
    except QualityInterrupted as e:
        print(f"effiformer bench: the quality smoke was interrupted after {e.done} of "
              f"{e.total} cells", file=sys.stderr)  # fmt: skip
        return 130
    ok = [r for r in records if r.get("status") == "ok"]
    print("  " + "; ".join(f"{r['mechanism']} {100 * r['valid']:.1f}%" for r in ok))
    print(
        f"  {len(ok)} of {len(records)} mechanisms trained and were scored. Six steps learn "
        "nothing: what each mechanism learns at a budget that means something is the CPU table "
        "of docs/quality.md (effiformer bench --part quality --budget cpu)."
    )
    return 0 if len(ok) == len(records) else 1
