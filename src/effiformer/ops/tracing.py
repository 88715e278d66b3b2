"""Whether a value of a tensor can be read here: the one check behind every shortcut that looks
at a tensor's values (an input check, "is any row padded?"), so that ``torch.compile`` and
``torch.export`` trace one graph and CUDA runs without a host sync per forward.

    if can_read_values(mask) and bool(mask.all()):
        mask = None              # a shortcut taken only where reading costs nothing
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["can_read_values", "general_path", "tracing"]

_LOCAL = threading.local()


@contextlib.contextmanager
def general_path() -> Iterator[None]:
    """Within it, :func:`can_read_values` is False everywhere, so eager code takes the path a
    traced graph takes (a padding mask stays a tensor where eager would drop an all-True one):
    what :mod:`effiformer.export` builds its example inputs with."""
    before = getattr(_LOCAL, "general", False)
    _LOCAL.general = True
    try:
        yield
    finally:
        _LOCAL.general = before


def tracing() -> bool:
    """Whether ``torch.compile`` or ``torch.export`` is tracing the code that calls this."""
    compiler = getattr(torch, "compiler", None)
    for probe in ("is_compiling", "is_exporting"):
        fn = getattr(compiler, probe, None)
        if fn is not None and fn():
            return True
    return False


def can_read_values(t: Tensor) -> bool:
    """Whether reading a value of ``t`` costs nothing and breaks nothing: a CPU tensor outside
    tracing. Reading a traced tensor is data-dependent (a graph break, no export); reading a CUDA
    tensor is a host sync. Callers take the general path (or skip a check that something else
    also makes) when this is False."""
    if t.device.type != "cpu" or tracing() or getattr(_LOCAL, "general", False):
        return False
    return not isinstance(t, torch._subclasses.FakeTensor)
