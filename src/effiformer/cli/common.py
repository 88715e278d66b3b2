"""What the subcommands share: logging that does not break progress bars, the graceful Ctrl-C
handler (:class:`GracefulInterrupt`), the ``--debug`` / ``--no-progress`` flags and how errors
reach the user (:func:`report_error`: one line, never a traceback unless ``--debug``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from ..checkpoint import CONFIG, LATEST, META, TRAINER_STATE, WEIGHTS, CheckpointError
from ..progress import TqdmLoggingHandler

__all__ = [
    "nonneg_int",
    "positive_float",
    "positive_int",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "GracefulInterrupt",
    "add_common_flags",
    "report_error",
    "saved_model_dir",
    "saved_model_lacks",
    "setup_logging",
]

#: Exit status of a user's mistake (bad flag, bad input, missing or corrupt file), as argparse's.
EXIT_ERROR = 2
#: Exit status of a run that failed (a diverging loss, an unexpected error).
EXIT_FAILED = 1
#: Exit status after Ctrl-C (128 + SIGINT, what shells report).
EXIT_INTERRUPTED = 130


def setup_logging() -> None:
    """INFO logs to stderr through ``tqdm.write`` (so a log line never breaks a progress bar);
    WARNING only on ranks other than 0 under torchrun."""
    root = logging.getLogger()
    if not root.handlers:
        handler = TqdmLoggingHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    if int(os.environ.get("RANK", "0")) != 0:
        logging.getLogger("effiformer").setLevel(logging.WARNING)


def add_common_flags(
    p: argparse.ArgumentParser, *, progress: bool = True, threads: bool = False
) -> None:
    """``--debug`` (and ``--no-progress``, and ``--threads``) on a subcommand's parser.
    ``--debug`` is also a flag of ``effiformer`` itself; here it defaults to "not given" so either
    place works. ``--threads N`` is applied by :func:`apply_threads` before the command runs."""
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of an error",
    )
    if threads:
        p.add_argument(
            "--threads",
            type=positive_int,
            default=None,
            help="CPU threads torch uses (default: torch's, one per core); fewer keeps a busy "
            "machine from oversubscribing its cores",
        )
    if progress:
        p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def apply_threads(args: argparse.Namespace) -> None:
    """``torch.set_num_threads(args.threads)`` where the command took ``--threads``."""
    n = getattr(args, "threads", None)
    if n is not None:
        import torch

        torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------
# Ctrl-C
# ------------------------------------------------------------------------------------------------


class GracefulInterrupt:
    """Turn the first Ctrl-C (SIGINT; under torchrun also the SIGTERM its agent forwards) into a
    request to stop cleanly, the second into an immediate exit.

    ``with GracefulInterrupt("train") as stop:`` installs the handlers (main thread only; the
    previous ones come back on exit, unless a stop was requested: then a further signal still
    quits at once). The first signal sets ``stop.requested``, prints one line
    saying what happens next (``message``) and calls ``on_request`` if given; the work polls
    ``stop.requested`` at safe points (the trainer: after each step) and winds down. Inside
    ``with stop.abortable():`` the first signal also raises ``KeyboardInterrupt`` there, for work
    that is safe to abandon (an evaluation). A second signal prints one line and ends the
    process at once with status 130 (``os._exit``: no cleanup runs, so everything written must be
    atomic, as checkpoints and result files are).

    The bench harness can use it the same way: poll ``requested`` between cells, keep the
    finished ones.
    """

    def __init__(
        self,
        command: str,
        message: str = "interrupted: finishing the current step, then saving "
        "(Ctrl-C again to quit at once)",
        *,
        on_request: Callable[[], None] | None = None,
        signals: tuple[int, ...] | None = None,
    ) -> None:
        self.command = command
        self.message = message
        self.on_request = on_request
        if signals is None:
            signals = (signal.SIGINT,)
            if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:
                signals += (signal.SIGTERM,)  # torchrun's agent forwards Ctrl-C as SIGTERM
        self.signals = signals
        self.requested = False
        self._abortable = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.requested:  # after a stop request any further Ctrl-C quits at once, to the end
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    @contextlib.contextmanager
    def abortable(self) -> Iterator[None]:
        """A region the first signal abandons with ``KeyboardInterrupt`` (see the class doc)."""
        if self.requested:
            raise KeyboardInterrupt
        self._abortable += 1
        try:
            yield
        finally:
            self._abortable -= 1

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            _say(f"effiformer {self.command}: interrupted again: exiting now")
            os._exit(EXIT_INTERRUPTED)
        self.requested = True
        if int(os.environ.get("RANK", "0")) == 0:
            _say(f"effiformer {self.command}: {self.message}")
        if self.on_request is not None:
            self.on_request()
        if self._abortable:
            raise KeyboardInterrupt


def _say(line: str) -> None:
    """One line on stderr that does not break a progress bar."""
    try:
        from tqdm.auto import tqdm

        tqdm.write(line, file=sys.stderr)
    except Exception:  # pragma: no cover - printing must not fail the handler
        print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------

#: Errors that are the user's mistake: bad flags, values, input files, checkpoints.
_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, OSError)


def report_error(command: str | None, error: BaseException) -> int:
    """Print ``effiformer COMMAND: error: MESSAGE`` (one line) and return the exit status:
    :data:`EXIT_ERROR` for a user's mistake (``ValueError`` and its kind: bad input, missing or
    corrupt files), :data:`EXIT_FAILED` for a failed run (a non-finite loss) or an unexpected
    error (named by its type, with a hint to rerun with ``--debug``)."""
    where = f"effiformer {command}" if command else "effiformer"
    if isinstance(error, KeyError) and error.args:
        msg = str(error.args[0])
    else:
        msg = str(error)
    msg = " ".join(msg.split()) or type(error).__name__
    if isinstance(error, FloatingPointError):
        print(f"{where}: error: {msg}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(error, OSError) and not isinstance(
        error, (FileNotFoundError, FileExistsError, ValueError)
    ):
        name = getattr(error, "filename", None)
        reason = error.strerror or msg
        msg = f"{name}: {reason}" if name and str(name) not in reason else reason
        print(f"{where}: error: {msg}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(error, _USER_ERRORS):
        print(f"{where}: error: {msg}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(error, MemoryError) or "out of memory" in msg.lower():
        print(f"{where}: error: out of memory ({msg}); use smaller batches", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"{where}: error: {type(error).__name__}: {msg} (this looks like a bug; rerun with "
        "--debug for the traceback)",
        file=sys.stderr,
    )
    return EXIT_FAILED


# ------------------------------------------------------------------------------------------------
# Saved models (effiformer.save_model) where a command takes a run
# ------------------------------------------------------------------------------------------------


def saved_model_dir(path: str | os.PathLike) -> Path | None:
    """``path`` as a folder of :func:`effiformer.save_model` (``model.safetensors`` +
    ``config.json``: weights and config, none of a training run's files: no ``meta.json``,
    ``trainer.pt`` or ``latest``), else None: a run directory, a run checkpoint, or something
    :func:`effiformer.checkpoint.resolve_checkpoint` names in its error. A run checkpoint whose
    ``meta.json`` is missing still has ``trainer.pt``, so it stays an interrupted save."""
    p = Path(path)
    if not p.is_dir() or any((p / name).exists() for name in (META, TRAINER_STATE, LATEST)):
        return None
    if (p / CONFIG).is_file() and (p / WEIGHTS).is_file():
        return p
    return None


def saved_model_lacks(directory: Path, what: str, how: str) -> CheckpointError:
    """The one-line error of a command given a saved model that lacks what it needs: ``DIR is a
    saved model (effiformer.save_model: weights and config only) without WHAT; HOW``."""
    return CheckpointError(
        f"{str(directory)!r} is a saved model (effiformer.save_model: weights and config only) "
        f"without {what}; {how}"
    )


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1, else a usage error naming the value."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """argparse ``type=``: a number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def device_name(text: str) -> str:
    """argparse ``type=``: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, checked when the
    command line is read (before any data is loaded)."""
    kind, _, index = text.partition(":")
    if text in ("auto", "cpu", "cuda", "mps") or (kind == "cuda" and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda, cuda:N or mps, got {text!r}")
