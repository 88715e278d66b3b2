"""``effiformer bench``: parse, call :func:`effiformer.bench.run_bench`, print the table."""

from __future__ import annotations

import argparse

import torch

from ..bench import (
    DEFAULT_LENGTHS,
    DEFAULT_NAMES,
    DTYPES,
    MEMORY_METHODS,
    PARTS,
    format_references,
    load_plugin,
    run_bench,
)

EPILOG = """examples:
  effiformer bench
  effiformer bench 'vanilla-*' --lengths 256 1024 4096 --batch 1 --part attention
  effiformer bench vanilla-small --set n_layers=2 --out bench-out
  effiformer bench --list-refs"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time and memory of models or attention layers against sequence length",
        description="Benchmark registered models (or one attention layer of each) across lengths.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "names", nargs="*", metavar="NAME",
        help="registered names or globs (default set: "
        f"{' '.join(DEFAULT_NAMES)}, --part both, the default lengths, --refs sdpa)",
    )  # fmt: skip
    p.add_argument(
        "--lengths", nargs="+", type=_positive_int, default=list(DEFAULT_LENGTHS), metavar="T",
        help=f"sequence lengths (default: {' '.join(map(str, DEFAULT_LENGTHS))})",
    )  # fmt: skip
    p.add_argument("--batch", type=_positive_int, default=1, help="batch size (default: 1)")
    p.add_argument(
        "--part", choices=["model", "attention", "both"], default=None,
        help="whole model, one attention layer (model.attention_part), or both "
        "(default: model when names are given, both for the default set)",
    )  # fmt: skip
    p.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help="config overrides for every name, e.g. --set n_layers=2 dim=128",
    )  # fmt: skip
    p.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default: cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="default: float32")
    p.add_argument(
        "--threads", type=_positive_int, default=None,
        help=f"intra-op threads per cell (default: torch's, here {torch.get_num_threads()})",
    )  # fmt: skip
    p.add_argument(
        "--repeats", type=_positive_int, default=5, help="timed runs (median; default 5)"
    )
    p.add_argument(
        "--warmup", type=_nonneg_int, default=1,
        help="plain warm-up runs after the two FLOP-counting passes (default: 1)",
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
        "--max-memory-mib", type=_positive_float, default=None,
        help="skip cells whose estimated memory exceeds this (default: available memory)",
    )  # fmt: skip
    p.add_argument(
        "--memory-method", choices=list(MEMORY_METHODS), default="auto",
        help="CPU peak memory: clear_refs (reset high-water mark) or maxrss (first-step "
        "getrusage difference); auto picks clear_refs when /proc allows (default)",
    )  # fmt: skip
    p.add_argument(
        "--cell-timeout", type=_positive_float, default=1800.0,
        help="seconds before a cell is killed and reported as skipped (default: 1800)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-plot", action="store_true", help="do not draw bench.png")


def run(args: argparse.Namespace) -> int:
    """``effiformer bench``: run, print the table, say where the files are."""
    if args.list_refs:
        for plugin in args.plugins:
            load_plugin(plugin)
        print(format_references())
        return 0
    parts = None if args.part is None else (PARTS if args.part == "both" else (args.part,))
    result = run_bench(
        args.names,
        lengths=args.lengths,
        batch=args.batch,
        parts=parts,
        overrides=args.overrides,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        repeats=args.repeats,
        warmup=args.warmup,
        out=args.out,
        refs=args.refs,
        refs_only=args.refs_only,
        plugins=args.plugins,
        max_memory_mib=args.max_memory_mib,
        memory_method=args.memory_method,
        cell_timeout=args.cell_timeout,
        progress=not args.no_progress,
        plot=not args.no_plot,
    )
    env = result.env
    peak = env.get("peak_tflops")
    print(
        f"# torch {env['torch']} on {env['device_name']} ({env['device']}), {env['threads']} "
        f"threads, {env['dtype']}, matmul peak {peak:.3f} TFLOP/s, git {env['git_sha']}"
        if peak is not None
        else f"# torch {env['torch']} on {env['device_name']}"
    )
    print(result.table)
    n_skipped = sum(r["status"] != "ok" for r in result.records)
    print(
        f"\nwrote {result.results_path}" + (f" and {result.plot_path}" if result.plot_path else "")
    )
    if n_skipped:
        print(f"{n_skipped} of {len(result.records)} cells skipped (see the note column)")
    return 0
