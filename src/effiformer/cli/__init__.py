"""The ``effiformer`` command: all argument parsing lives here (parse, call library functions,
print). Nothing in the library imports this package.

One module per subcommand, each with ``add_parser(subparsers)`` and ``run(args) -> int``:
:mod:`.list_cmd`, :mod:`.train_cmd`, :mod:`.eval_cmd`, :mod:`.bench_cmd`. Task options become
flags generically (:mod:`.flags`), so a newly registered task needs no change here.
"""

from __future__ import annotations

import argparse
import sys

from ..config import ConfigError
from . import bench_cmd, eval_cmd, list_cmd, search_cmd, train_cmd

__all__ = ["build_parser", "main"]

EPILOG = """examples:
  effiformer list                       # every registered configuration
  effiformer list 'vanilla-*'
  effiformer bench                      # default set, a few minutes on 2 CPU cores
  effiformer bench vanilla-small --lengths 512 1024 --batch 2 --part attention --out bench-out
  effiformer train vanilla-small --steps 200 --out runs/small
  effiformer train vanilla-small --data ../shared/data/tinyshakespeare/input.txt --format text
  effiformer train funnel-tiny --task mlm --text ../shared/data/tinyshakespeare/input.txt
  effiformer eval runs/small
"""

COMMANDS = {
    "list": list_cmd,
    "bench": bench_cmd,
    "train": train_cmd,
    "eval": eval_cmd,
    "search": search_cmd,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="effiformer",
        description="Efficient Transformers behind one interface.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{list,train,eval,bench,search}")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command].run(args)
    except (ConfigError, KeyError, ValueError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"effiformer {args.command}: error: {msg}", file=sys.stderr)
        return 2
