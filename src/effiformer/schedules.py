"""Learning-rate schedules as multipliers of the peak rate (for ``torch.optim.lr_scheduler.LambdaLR``).

:func:`inverse_sqrt_factor`: Vaswani et al. 2017 (arXiv 1706.03762) eq. 3,
``lr = d^-0.5 * min(n^-0.5, n * warmup^-1.5)``, written as fairseq's ``inverse_sqrt`` scheduler
writes it: linear warmup to the peak over ``warmup`` steps, then ``peak * sqrt(warmup / n)``
(the paper's rate is this with ``peak = d^-0.5 * warmup^-0.5``, 7.0e-4 for d = 512 and 4000
warmup steps). It needs no total step count, so it suits a run stopped by a time budget.
"""

from __future__ import annotations

import math

__all__ = ["inverse_sqrt_factor"]


def inverse_sqrt_factor(step: int, *, warmup: int) -> float:
    """Multiplier of the peak lr for optimiser step ``step + 1`` (``step`` steps done)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    n = step + 1
    if n < warmup:
        return n / warmup
    return math.sqrt(max(warmup, 1) / n)
