"""``effiformer list``: registered model configurations matching a glob, with parameter counts
(counted on the meta device: no memory is allocated and no weight initialised)."""

from __future__ import annotations

import argparse
import sys

import torch

from ..registry import build_model, get_spec, list_models
from .common import add_common_flags


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list registered model configurations",
        description="List registered model configurations matching a glob, with their "
        "parameter counts (tied weights counted once).",
        epilog="examples:\n  effiformer list\n  effiformer list 'vanilla-*'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pattern", nargs="?", default="*", help="glob over names (default: *)")
    p.add_argument("-v", "--verbose", action="store_true", help="show each config")
    add_common_flags(p, progress=False)


def count_parameters(config) -> int | None:
    """Parameters of the model ``config`` builds (each tensor once), built on the meta device;
    None if it cannot be built there."""
    try:
        with torch.device("meta"):
            model = build_model(config)
    except Exception:  # a model whose constructor needs real data: no count rather than a failure
        return None
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def format_count(n: int | None) -> str:
    """``124.7K``, ``3.29M``, ``1.20B`` (``?`` for None)."""
    if n is None:
        return "?"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)


def run(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        print(f"no registered model matches {args.pattern!r}", file=sys.stderr)
        return 1
    for name in names:
        spec = get_spec(name)
        params = format_count(count_parameters(spec.config))
        line = f"{name:<28} {spec.family:<12} {params:>7}  {spec.description}"
        print(line.rstrip())
        if args.verbose:
            print(f"    {spec.config}")
    return 0
