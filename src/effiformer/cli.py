"""The ``effiformer`` command: thin over the library (parse, call library functions, print).

Each subcommand has one ``_<name>_parser`` function that declares its arguments and one
``_cmd_<name>`` function that calls the library.
"""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError

EPILOG = """examples:
  effiformer list                       # every registered configuration
  effiformer list 'vanilla-*'
  effiformer bench                      # default set, a few minutes on 2 CPU cores
  effiformer bench vanilla-small --lengths 512 1024 --batch 2 --part attention --out bench-out
  effiformer train vanilla-small --steps 200 --out runs/small
  effiformer train vanilla-small --data ../shared/data/tinyshakespeare/input.txt --format text
  effiformer eval runs/small
"""


def _list_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list registered model configurations",
        description="List registered model configurations matching a glob.",
        epilog="examples:\n  effiformer list\n  effiformer list 'vanilla-*'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pattern", nargs="?", default="*", help="glob over names (default: *)")
    p.add_argument("-v", "--verbose", action="store_true", help="show each config")


def _cmd_list(args: argparse.Namespace) -> int:
    from .registry import get_spec, list_models

    names = list_models(args.pattern)
    if not names:
        print(f"no registered model matches {args.pattern!r}", file=sys.stderr)
        return 1
    for name in names:
        spec = get_spec(name)
        line = f"{name:<28} {spec.family:<12} {spec.description}"
        print(line.rstrip())
        if args.verbose:
            print(f"    {spec.config}")
    return 0


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    from .benchmark import add_bench_arguments

    p = sub.add_parser(
        "bench",
        help="time and memory of models or attention layers against sequence length",
        description="Benchmark registered models (or one attention layer of each) across lengths.",
        epilog=(
            "examples:\n  effiformer bench\n"
            "  effiformer bench 'vanilla-*' --lengths 256 1024 4096 --batch 1 --part attention\n"
            "  effiformer bench vanilla-small --set n_layers=2 --out bench-out"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bench_arguments(p)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import run_bench_cli

    return run_bench_cli(args)


def _train_parser(sub: argparse._SubParsersAction) -> None:
    from .train import add_train_arguments

    p = sub.add_parser(
        "train",
        help="train a registered model",
        description="Train a registered model on the embedded corpus or a corpus on disk.",
        epilog=(
            "examples:\n  effiformer train vanilla-tiny --steps 50 --out runs/tiny\n"
            "  effiformer train vanilla-small --data ../shared/data/tinyshakespeare/input.txt "
            "--format text --time-budget 600 --out runs/shakespeare\n"
            "  effiformer train vanilla-small --resume runs/shakespeare --steps 2000"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_train_arguments(p)


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import run_train_cli

    return run_train_cli(args)


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    from .train import add_eval_arguments

    p = sub.add_parser(
        "eval",
        help="evaluate a checkpoint",
        description="Evaluate a checkpoint directory on a corpus split.",
        epilog="examples:\n  effiformer eval runs/tiny\n"
        "  effiformer eval runs/ptb --data ../shared/data/ptb --format ptb --split test",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_eval_arguments(p)


def _cmd_eval(args: argparse.Namespace) -> int:
    from .train import run_eval_cli

    return run_eval_cli(args)


COMMANDS = {
    "list": (_list_parser, _cmd_list),
    "bench": (_bench_parser, _cmd_bench),
    "train": (_train_parser, _cmd_train),
    "eval": (_eval_parser, _cmd_eval),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="effiformer",
        description="Efficient Transformers behind one interface.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{list,train,eval,bench}")
    for make_parser, _ in COMMANDS.values():
        try:
            make_parser(sub)
        except ImportError:  # a subcommand whose module is not there yet
            continue
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command][1](args)
    except (ConfigError, KeyError, ValueError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"effiformer {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
