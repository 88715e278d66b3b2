"""The ``effiformer`` command: all argument parsing lives here (parse, call library functions,
print). Nothing in the library imports this package.

One module per subcommand, each with ``add_parser(subparsers)`` and ``run(args) -> int``:
:mod:`.list_cmd`, :mod:`.train_cmd`, :mod:`.eval_cmd`, :mod:`.generate_cmd`,
:mod:`.translate_cmd`, :mod:`.bench_cmd`, :mod:`.export_cmd`. Task options become flags generically (:mod:`.flags`),
so a newly registered task needs no change here.

Errors: every exception a command raises reaches the user as one line on stderr and a non-zero
exit (2 for a user's mistake, 1 for a failed run, 130 after Ctrl-C), never a traceback;
``--debug`` (before or after the command name) shows the traceback instead
(:func:`effiformer.cli.common.report_error`).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing

from . import (
    average_cmd,
    bench_cmd,
    eval_cmd,
    export_cmd,
    generate_cmd,
    list_cmd,
    search_cmd,
    train_cmd,
    translate_cmd,
)
from .common import EXIT_ERROR, EXIT_INTERRUPTED, apply_threads, report_error

__all__ = ["build_parser", "main"]

EPILOG = """examples:
  effiformer list                       # every registered configuration, with parameter counts
  effiformer list 'vanilla-*'
  effiformer bench                      # default set, a few minutes on 2 CPU cores
  effiformer bench vanilla-small --lengths 512 1024 --batch 2 --part attention --out bench-out
  effiformer train vanilla-tiny --steps 200 --out runs/tiny     # the embedded corpus, no download
  effiformer train vanilla-small --data DATA/tinyshakespeare/input.txt --format text \\
      --time-budget 600 --out runs/shakespeare
  effiformer generate runs/shakespeare --prompt 'ROMEO:' --max-new-tokens 200
  effiformer train funnel-tiny --task mlm --text DATA/tinyshakespeare/input.txt --out runs/pre
  effiformer train transformer-multi30k --task translation --data DATA/multi30k --src en \\
      --tgt de --time-budget 3600 --out runs/m30k
  effiformer translate runs/m30k < sentences.en > sentences.de
  effiformer eval runs/tiny
  torchrun --nproc_per_node 2 -m effiformer train vanilla-small --out runs/ddp   # 2 processes
(DATA: your copy of the data sets; see the README. --debug shows a traceback on errors.)
"""


COMMANDS = {
    "list": list_cmd,
    "train": train_cmd,
    "eval": eval_cmd,
    "generate": generate_cmd,
    "translate": translate_cmd,
    "export": export_cmd,
    "bench": bench_cmd,
    "search": search_cmd,
    "average": average_cmd,
}


def _version() -> str:
    import platform

    import torch

    from .. import __version__

    return (
        f"effiformer {__version__} (torch {torch.__version__}, python {platform.python_version()})"
    )


class _Parser(argparse.ArgumentParser):
    """An argument error is one line naming the problem and where the help is (argparse's own
    printed the whole usage block, 14-40 lines, before the line that mattered). Subcommand
    parsers are of this class too (``add_subparsers`` uses the parent's class)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="effiformer",
        description="Efficient Transformers behind one interface.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    debug = bool(getattr(args, "debug", False)) or bool(os.environ.get("EFFIFORMER_DEBUG"))
    try:
        apply_threads(args)
        return COMMANDS[args.command].run(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"effiformer {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except Exception as e:
        if debug:
            raise
        return report_error(args.command, e)
