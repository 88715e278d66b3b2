"""Progress for long steps: bars for evaluation and decoding, status lines for steps of unknown
length (reading a corpus, training a tokenizer), and log lines that do not break a bar.

Whether bars are drawn is one switch, :func:`progress_enabled` (a context manager; a context
variable, so it nests and is per thread): the trainer turns it on for its evaluations when its
own bar is on (``TrainConfig.progress``), the command line for every command unless
``--no-progress``. Outside any such block the default is on when stderr is a terminal.

* :func:`progress_bar` / :func:`track` (a loop that ticks one) -- a ``tqdm`` bar on stderr (disabled when progress is off); ``leave``
  defaults to False, so an evaluation's bar disappears when it is done and the training bar
  below it stays.
* :func:`status` -- ``with status("reading PTB", logger):`` logs ``reading PTB ...`` once the
  step has taken a second, then ``reading PTB: done in 2.3 s`` (INFO): progress for a step that
  cannot count its work.
* :class:`TqdmLoggingHandler` -- a logging handler that writes through ``tqdm.write``, which
  clears the bars, prints the line and redraws them (``effiformer`` CLI logging uses it; the
  trainer also redirects the root logger's console handlers while its bar is drawn).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = [
    "TqdmLoggingHandler",
    "is_enabled",
    "progress_bar",
    "progress_enabled",
    "status",
    "track",
]

T = TypeVar("T")

_ENABLED: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "effiformer_progress", default=None
)


def is_enabled() -> bool:
    """Whether bars are drawn here: the innermost :func:`progress_enabled`, else whether stderr
    is a terminal."""
    value = _ENABLED.get()
    if value is not None:
        return value
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def progress_enabled(flag: bool) -> Iterator[None]:
    """Draw bars (``True``) or not (``False``) inside the block."""
    token = _ENABLED.set(bool(flag))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def progress_bar(
    total: int | None = None,
    *,
    desc: str = "",
    unit: str = "it",
    leave: bool = False,
    delay: float = 0.0,
    **kwargs: Any,
):
    """A ``tqdm`` bar on stderr, disabled when progress is off (see the module docstring).
    ``delay``: seconds before it first appears (short work draws nothing)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        leave=leave,
        delay=delay,
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not is_enabled(),
        **kwargs,
    )


def track(
    iterable: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it"
) -> Iterator[T]:
    """The items of ``iterable``, ticking a :func:`progress_bar` (closed when the loop ends,
    also by ``break`` or an exception)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    bar = progress_bar(total, desc=desc, unit=unit)
    try:
        for item in iterable:
            yield item
            bar.update(1)
    finally:
        bar.close()


@contextlib.contextmanager
def status(
    what: str, logger: logging.Logger | None = None, *, after: float = 1.0
) -> Iterator[None]:
    """Progress for a step that cannot count its work: if the block is still running after
    ``after`` seconds, log ``what ...`` (INFO on ``logger``, default ``effiformer``), and then
    ``what: done in S s`` when it ends; quick steps log nothing. ``after=0``: log at once."""
    log = logger or logging.getLogger("effiformer")
    started = threading.Event()

    def announce() -> None:
        started.set()
        log.info("%s ...", what)

    t0 = time.monotonic()
    timer = None
    if after > 0:
        timer = threading.Timer(after, announce)
        timer.daemon = True
        timer.start()
    else:
        announce()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
    if started.is_set():
        log.info("%s: done in %.1f s", what, time.monotonic() - t0)


class TqdmLoggingHandler(logging.Handler):
    """Write records through ``tqdm.write`` (to stderr), so they do not break a bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm.auto import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise
            self.handleError(record)
