"""Where the benchmark scripts find the data sets they read (tinyshakespeare, PTB, GLUE, Multi30k,
HAT's latency files): the folder ``--data DIR`` names, else ``$EFFIFORMER_DATA``, else
``../shared/data`` beside the checkout (the folder the tests' ``shared_data`` fixture reads).

A script checks what it needs before doing any work; a data set that is not there ends it with
exit status 2 and one line on stderr, never a traceback::

    train_tinyshakespeare.py: needs tinyshakespeare/input.txt under the data folder /x/y (set --data DIR or EFFIFORMER_DATA)

Scripts whose ``--data`` named the data set itself (the Multi30k folder, ``input.txt``, the
latency files' folder) still accept that: :func:`require_dataset`.

The scripts import this module from their own folder::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _data  # noqa: E402
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

__all__ = [
    "DEFAULT",
    "ENV",
    "EXIT_MISSING",
    "add_data_flag",
    "data_root",
    "fail",
    "parallel_folder",
    "require",
    "require_dataset",
]

#: The environment variable naming the data folder.
ENV = "EFFIFORMER_DATA"
#: The data folder when neither ``--data`` nor ``$EFFIFORMER_DATA`` is given.
DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data"
#: Exit status of a missing data set (argparse's, and ``effiformer``'s, for a user's mistake).
EXIT_MISSING = 2


def data_root(value: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``value`` (a ``--data`` argument) when given, else ``$EFFIFORMER_DATA``,
    else ``../shared/data`` beside the checkout."""
    if value:
        return Path(value)
    env = os.environ.get(ENV)
    return Path(env) if env else DEFAULT


def add_data_flag(parser: argparse.ArgumentParser, *, itself: str | None = None) -> None:
    """Add ``--data DIR`` (default: ``$EFFIFORMER_DATA``, else ``../shared/data``) to
    ``parser``; ``itself``: what ``--data`` may name instead (the data set itself, as older
    versions of the script took)."""
    text = f"the data folder (default: ${ENV}, else ../shared/data beside the checkout)"
    if itself:
        text += f"; or {itself} itself"
    parser.add_argument("--data", metavar="DIR", default=None, help=text)


def fail(script: str, names: list[str], root: Path) -> NoReturn:
    """Print ``SCRIPT: needs NAMES under the data folder ROOT (set --data DIR or
    EFFIFORMER_DATA)`` on stderr and exit with :data:`EXIT_MISSING`."""
    print(
        f"{Path(script).name}: needs {', '.join(names)} under the data folder {root} "
        f"(set --data DIR or {ENV})",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(EXIT_MISSING)


def require(script: str, value: str | None, *names: str) -> Path:
    """The data folder (:func:`data_root` of ``value``) after checking that each of ``names``
    (paths relative to it) exists; otherwise :func:`fail` naming the missing ones."""
    root = data_root(value)
    missing = [name for name in names if not (root / name).exists()]
    if missing:
        fail(script, missing, root)
    return root


def require_dataset(
    script: str,
    value: str | None,
    name: str,
    *,
    is_dataset: Callable[[Path], bool],
    what: str | None = None,
) -> Path:
    """The path of the data set ``name`` (relative to the data folder) if ``is_dataset`` holds
    there; else ``value`` itself when ``--data`` names the data set (``is_dataset(value)``);
    else :func:`fail`. ``what``: how the message names the data set (default ``name``)."""
    root = data_root(value)
    if is_dataset(root / name):
        return root / name
    if value and is_dataset(Path(value)):
        return Path(value)
    fail(script, [what or name], root)


def parallel_folder(*langs: str) -> Callable[[Path], bool]:
    """``is_dataset`` of a folder of parallel text (:class:`effiformer.data.ParallelData`): it
    holds the ``train`` split of each of ``langs`` (``train.en`` or ``train.en.gz``), or of some
    language when none are given."""

    def check(path: Path) -> bool:
        if not path.is_dir():
            return False
        if not langs:
            return any(path.glob("train.*"))
        return all(
            (path / f"train.{lang}").is_file() or (path / f"train.{lang}.gz").is_file()
            for lang in langs
        )

    return check
