"""Time budgets: sizing the schedule from the measured step time (:class:`BudgetPlanner`)."""

from __future__ import annotations

import logging
from typing import Any

from .config import TrainConfig

__all__ = ["BudgetPlanner"]

logger = logging.getLogger(__name__)


class BudgetPlanner:
    """Sizes the schedule from the time budget (``steps=None``) or warns that a fixed schedule
    will not fit it; see :class:`TrainConfig`. ``plan`` (``total``, ``warmup``) is what the lr
    schedule reads.

    The schedule is sized after the first steps (logged), re-sized at 25, 50 and 75% of the
    budget (logged) from the seconds per step *since the previous sizing* (the first steps of a
    run are slower than the rest, so an average from the start overestimates them), and after
    75% re-sized quietly after every step, so that the step at which the budget runs out is the
    end of the schedule: the decay finishes when the run stops (:meth:`finish` logs where)."""

    MARKS = (0.25, 0.5, 0.75)

    def __init__(self, config: TrainConfig, plan: dict[str, int], start_step: int) -> None:
        self.config = config
        self.plan = plan
        self.start = start_step
        self.t_first: float | None = None  # elapsed when the first step of this call ended
        self.first_done = False
        self.marks = list(self.MARKS)
        self.active = config.time_budget is not None
        self.since: tuple[int, float] | None = None  # (step, elapsed) of the previous sizing
        self.sized = False  # whether this call sized the schedule

    def after_step(self, step: int, elapsed: float) -> dict[str, Any] | None:
        """Called after every step with the budget clock; returns a plan record when it planned
        (and logged); quiet re-sizings after the last mark return None."""
        if not self.active:
            return None
        budget = float(self.config.time_budget)  # type: ignore[arg-type]
        done = step - self.start
        if done == 1:
            self.t_first = elapsed
            self.since = (step, elapsed)
            return None
        if self.t_first is None or done < 2:
            return None
        quiet = False
        if not self.first_done:
            if done < 5 and elapsed < 0.1 * budget:
                return None
        elif not self.marks:
            quiet = self.config.steps is None  # past the last mark: follow the clock
            if not quiet:
                return None
        elif elapsed < self.marks[0] * budget:
            return None
        assert self.since is not None
        s0, e0 = self.since
        step_s = (elapsed - e0) / max(step - s0, 1)
        # whole steps that fit (a hair of tolerance: 4.9 s / 0.1 s is 48.99999 in floating point)
        fits = step + int(max(0.0, budget - elapsed) / max(step_s, 1e-9) + 1e-6)
        first = not self.first_done
        self.first_done = True
        while self.marks and elapsed >= self.marks[0] * budget:
            self.marks.pop(0)
        if self.config.steps is not None:  # a fixed schedule: only say when it cannot fit
            self.active = False
            if fits < self.plan["warmup"]:
                logger.warning(
                    "the time budget (%.0f s at %.3g s/step) fits about %d steps, fewer than the "
                    "warmup (%d of %d steps): the run will end in warmup; leave out steps "
                    "(--steps) to size the schedule from the budget",
                    budget,
                    step_s,
                    fits,
                    self.plan["warmup"],
                    self.config.steps,
                )
            return None
        total = max(fits, step + 1)
        self.sized = True
        if quiet:  # the window stays at the last logged sizing (at least a quarter of the run)
            self.plan["total"] = total
            return None
        self.since = (step, elapsed)
        warmup = self.plan["warmup"]
        note = ""
        if first:
            cap = self.config.planned_warmup_cap
            if cap is not None and step < warmup and warmup > cap * total:  # still warming up
                capped = max(1, int(cap * total), step)
                note = f" (warmup {warmup} capped to {capped}, {cap:.0%} of the run)"
                warmup = capped
        self.plan.update(total=total, warmup=warmup)
        record = {
            "step": step,
            "total_steps": total,
            "warmup": warmup,
            "step_s": step_s,
            "budget_s": budget,
        }
        logger.info(
            "time budget %.0f s at %.3g s/step (steps %d-%d): schedule sized to %d steps, "
            "warmup %d%s",
            budget,
            step_s,
            s0 + 1,
            step,
            total,
            warmup,
            note,
        )
        return record

    def finish(self, step: int) -> dict[str, Any] | None:
        """The schedule's end where this call sized it: the run's last step is its last step
        (the plan is set to end there: a resumed run continues from a finished decay only if it
        is given steps or a new budget). Returns the record to write, or None."""
        if not self.sized:
            return None
        if self.plan["total"] != step:
            logger.info(
                "time budget spent at step %d; the schedule (sized to %d) ends there",
                step,
                self.plan["total"],
            )
        self.plan["total"] = step
        return {"step": step, "total_steps": step, "warmup": self.plan["warmup"], "final": True}
