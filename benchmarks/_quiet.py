"""A measurement on a quiet machine beside training lanes: ``paused(pids)`` stops the given
processes (SIGSTOP) for a block and continues them after (SIGCONT), also when the block fails
or this process is terminated. ``group=True`` stops each one's whole process group (a lane
script whose cells run in child processes); this process's own group is never stopped.

The scripts import this module from their own folder::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _quiet  # noqa: E402
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["paused"]


def _send(target: int, sig: int, group: bool) -> None:
    if group:
        os.killpg(target, sig)
    else:
        os.kill(target, sig)


@contextmanager
def paused(pids: Sequence[int], *, group: bool = False) -> Iterator[list[int]]:
    """Stop ``pids`` (their process groups with ``group``) for the block; yields the ones
    stopped. Processes that no longer exist are left out, with one line on stderr."""
    stopped: list[int] = []
    for pid in pids:
        try:
            target = os.getpgid(pid) if group else pid
            if group and target == os.getpgrp():
                print(f"--pause: {pid} is in this process's own group; not stopping it",
                      file=sys.stderr)  # fmt: skip
                continue
            _send(target, signal.SIGSTOP, group)
            stopped.append(target)
        except ProcessLookupError:
            print(f"--pause: no process {pid}; measuring without pausing it", file=sys.stderr)
    previous = signal.getsignal(signal.SIGTERM)

    def _term(signum, frame):  # continue the lanes before dying
        raise SystemExit(128 + signum)

    if stopped:
        signal.signal(signal.SIGTERM, _term)
    try:
        if stopped:
            time.sleep(1.0)  # let the stopped processes leave the cores and caches
        yield stopped
    finally:
        for target in stopped:
            try:
                _send(target, signal.SIGCONT, group)
            except ProcessLookupError:
                pass
        if stopped:
            signal.signal(signal.SIGTERM, previous)
