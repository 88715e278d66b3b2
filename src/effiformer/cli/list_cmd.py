"""``effiformer list``: registered model configurations matching a glob, with parameter counts
(counted on the meta device: no memory is allocated and no weight initialised) and, for
translation models, Mult-Adds."""

from __future__ import annotations

import argparse
import sys

import torch

from ..flops import count_parameters, format_mult_adds, mult_adds
from ..registry import build_model, get_spec, list_models
from .common import add_common_flags


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list registered model configurations",
        description="List registered model configurations matching a glob, with their "
        "parameter counts (tied weights counted once). Translation models show their Mult-Adds "
        "(one 30-token sentence; embeddings and output projection excluded, as Lite Transformer "
        "and HAT count them).",
        epilog="examples:\n  effiformer list\n  effiformer list 'vanilla-*'\n"
        "  effiformer list --attention          # the attention parts, one line each",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pattern", nargs="?", default="*", help="glob over names (default: *)")
    p.add_argument("-v", "--verbose", action="store_true", help="show each config")
    p.add_argument(
        "--attention", action="store_true",
        help="list the registered attention parts (PATTERN globs over their names) with the "
        "masks they take; use one with --set attention.name=NAME",
    )  # fmt: skip
    add_common_flags(p, progress=False)


def parameters_of(config) -> int | None:
    """Parameters of the model ``config`` builds (each tensor once, embeddings included), built
    on the meta device; None if it cannot be built there."""
    try:
        with torch.device("meta"):
            model = build_model(config)
    except Exception:  # a model whose constructor needs real data: no count rather than a failure
        return None
    return count_parameters(model, embeddings=True)


def format_count(n: int | None) -> str:
    """``124.7K`` -> ``125K``, ``3.29M``, ``1.20B`` (``?`` for None)."""
    if n is None:
        return "?"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)


def _list_attention(pattern: str) -> int:
    from ..attention import get_attention, list_attentions

    names = list_attentions(pattern)
    if not names:
        print(f"no registered attention part matches {pattern!r}", file=sys.stderr)
        return 1
    print(f"{'# attention':<16} {'masks':<22} description")
    for name in names:
        spec = get_attention(name)
        print(f"{name:<16} {'/'.join(spec.modes):<22} {spec.description}".rstrip())
    return 0


def run(args: argparse.Namespace) -> int:
    if args.attention:
        return _list_attention(args.pattern)
    names = list_models(args.pattern)
    if not names:
        print(f"no registered model matches {args.pattern!r}", file=sys.stderr)
        return 1
    print(f"{'# name':<28} {'family':<12} {'params':>7} {'madds':>6} description")
    for name in names:
        spec = get_spec(name)
        params = format_count(parameters_of(spec.config))
        cost = mult_adds(spec.config)
        madds = format_mult_adds(cost) if cost is not None else ""
        line = f"{name:<28} {spec.family:<12} {params:>7} {madds:>6} {spec.description}"
        print(line.rstrip())
        if args.verbose:
            print(f"    {spec.config}")
    return 0
