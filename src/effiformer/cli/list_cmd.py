"""``effiformer list``: registered model configurations matching a glob."""

from __future__ import annotations

import argparse
import sys

from ..flops import format_mult_adds, mult_adds
from ..registry import get_spec, list_models


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list registered model configurations",
        description="List registered model configurations matching a glob. Translation models "
        "show their Mult-Adds (one 30-token sentence; embeddings and output projection "
        "excluded, as Lite Transformer and HAT count them).",
        epilog="examples:\n  effiformer list\n  effiformer list 'vanilla-*'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pattern", nargs="?", default="*", help="glob over names (default: *)")
    p.add_argument("-v", "--verbose", action="store_true", help="show each config")


def run(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        print(f"no registered model matches {args.pattern!r}", file=sys.stderr)
        return 1
    for name in names:
        spec = get_spec(name)
        cost = mult_adds(spec.config)
        madds = format_mult_adds(cost) if cost is not None else ""
        line = f"{name:<28} {spec.family:<12} {madds:>6} {spec.description}"
        print(line.rstrip())
        if args.verbose:
            print(f"    {spec.config}")
    return 0
