"""The loop: :func:`train` sets a run up (:class:`_Run`) and steps it until the steps, the time
budget or a stop request end it; see :mod:`effiformer.train` for what each step does."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..checkpoint import LATEST, resolve_checkpoint
from ..config import ConfigError
from .budget import BudgetPlanner
from .config import TrainConfig, schedule_function
from .distributed import (
    Dist,
    agree,
    average_updates,
    init_distributed,
    micro_scales,
    resolve_device,
)
from .history import METRICS, MetricsLog, TrainHistory
from .optimizer import after_optimizer_step, clip_gradients, make_optimizer
from .state import load_training_state, map_tensors, save_checkpoint, seed_everything
from .task import Task, check_batch_ids, check_task

__all__ = ["train"]

logger = logging.getLogger("effiformer.train")


def train(
    model: nn.Module, task: Task, config: TrainConfig | None = None, *, stop: Any = None
) -> TrainHistory:
    """Train ``model`` on ``task`` in place (see :mod:`effiformer.train`); return the history.

    Under ``torchrun`` every process calls this with the same arguments.

    ``stop``: a graceful-stop request (the command line passes its Ctrl-C handler, a
    ``GracefulInterrupt`` of its ``common`` module): any object whose ``requested`` attribute
    becomes true. It is read after every step (under DDP the ranks agree, an all-reduce); once
    true the loop ends after the step in progress, writes a checkpoint of that step (from which
    ``resume`` continues exactly) and returns with ``stop_reason="interrupted"``, skipping the
    final evaluation. If it has an ``abortable()`` context manager, evaluations run inside it
    (its owner may raise ``KeyboardInterrupt`` there to abandon an evaluation; that evaluation is
    then dropped and the run stops as above). Without ``stop`` a ``KeyboardInterrupt``
    propagates as usual and the last checkpoint written stays the newest.
    """
    config = TrainConfig() if config is None else config
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_task(task)
    d = init_distributed(config.device)
    try:
        history = _Run(model, task, config, d, stop).run()
        if d.owns_group:
            # Every rank is done (rank 0 writes the last checkpoint after the others have sent
            # their part) before any tears the group down: a rank that destroyed its gloo group
            # while rank 0 was still writing was seen to abort at exit.
            dist.barrier()
        return history
    finally:
        if d.owns_group:
            dist.destroy_process_group()


def _now() -> float:
    """The clock of time budgets (a function, so that tests can drive it)."""
    return time.monotonic()


class _Run:
    """One call of :func:`train`: the state it sets up (device, optimiser, schedule, resumed
    position, recurrent state, records) and what it does with it, one method each: a step
    (:meth:`step_once`), an evaluation, a checkpoint, the loop (:meth:`run`)."""

    def __init__(
        self, model: nn.Module, task: Task, config: TrainConfig, d: Dist, stop: Any
    ) -> None:
        self.t_begin = time.monotonic()
        self.task, self.config, self.d, self.stop = task, config, d, stop
        self.device = resolve_device(config.device, d)
        use_bf16 = config.bf16
        if use_bf16 is None:
            use_bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        self.bf16 = bool(use_bf16)

        self.out_dir = Path(config.out_dir) if config.out_dir is not None else None
        self.resume_dir = resolve_checkpoint(config.resume) if config.resume is not None else None
        if self.out_dir is not None:
            if self.resume_dir is None and (self.out_dir / LATEST).exists():
                raise ValueError(
                    f"out_dir {str(self.out_dir)!r} already holds a run (it has {LATEST!r}); "
                    "resume it (--resume) or choose another output directory"
                )
            if d.rank == 0:
                self.out_dir.mkdir(parents=True, exist_ok=True)
        if config.steps is None and config.time_budget is None and self.resume_dir is None:
            raise ConfigError("steps=None sizes the schedule from time_budget; give one of them")

        if self.resume_dir is None:
            seed_everything(config.seed + d.rank)
        self.module = model.to(self.device)
        self.module.train()
        self.vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
        self.optimizer = make_optimizer(self.module, config)
        # What the lr schedule reads: its length and warmup (a time budget may resize them).
        self.plan = {"total": config.steps or 0, "warmup": config.warmup}
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, schedule_function(config, self.plan)
        )
        self.accum = config.grad_accum
        self.step, self.states = 0, [None] * self.accum
        if self.resume_dir is not None:
            self.step, self.states, saved_plan = load_training_state(
                self.resume_dir,
                self.module,
                self.optimizer,
                self.scheduler,
                task,
                d,
                self.accum,
                self.device,
            )
            if saved_plan is not None and config.steps is None:
                self.plan.update(saved_plan)  # continue the planned schedule until re-planned
        if config.steps is None and config.time_budget is None and self.plan["total"] < 1:
            raise ConfigError(
                f"steps=None continues the schedule planned from a time budget, but "
                f"{str(self.resume_dir)!r} records none; give steps or a time_budget"
            )
        self.history = TrainHistory(start_step=self.step, step=self.step)
        if config.steps is not None:
            self.limit = float(config.steps)
        elif config.time_budget is not None:
            self.limit = math.inf  # the budget ends the run
        else:
            self.limit = float(self.plan["total"])

        runner: nn.Module = self.module
        if d.active:
            runner = nn.parallel.DistributedDataParallel(
                self.module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=config.find_unused_parameters,
            )
        if config.compile is not None:
            runner = torch.compile(runner, backend=config.compile)
            logger.info(
                "training forward and backward under torch.compile(backend=%r)", config.compile
            )
        self.runner = runner
        self.batches: Iterator[Any] = task.train_batches(self.module, d.rank, d.world)
        self.init_state = getattr(self.module, "init_state", None)
        self.apply_updates = getattr(self.module, "apply_updates", None)
        self.metric = getattr(task, "metric_name", "metric")
        self.split_prefix = {"valid": "val", "test": "test", "train": "train"}[config.eval_split]

        self.is_main = d.rank == 0
        self.show = bool(config.progress and self.is_main)
        self.metrics = MetricsLog(
            self.out_dir / METRICS if (self.out_dir is not None and self.is_main) else None,
            self.step if self.resume_dir is not None else None,
        )
        self.abortable = getattr(stop, "abortable", None)
        self.excluded = 0.0  # seconds the budget does not count (time_budget_counts_eval=False)
        self.last_eval: int | None = None
        self.last_ckpt: int | None = None

    # -- helpers ----------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def stop_requested(self) -> bool:
        return self.stop is not None and bool(getattr(self.stop, "requested", False))

    def kept(self, loss_at: int | None = None) -> str:
        """What the last checkpoint holds, for error messages."""
        h = self.history
        if h.checkpoint and loss_at is not None and self.last_ckpt == loss_at - 1:
            return (
                f"the last checkpoint, {h.checkpoint}, holds the weights that gave this "
                "loss: resume from an earlier one (keep_checkpoints / --keep keeps more)"
            )
        if h.checkpoint:
            return f"the last checkpoint, {h.checkpoint}, is unchanged"
        if self.resume_dir is not None:
            return f"the checkpoint resumed from, {self.resume_dir}, is unchanged"
        return "no checkpoint was written"

    def diverged(self, what: str, loss_at: int | None = None) -> FloatingPointError:
        return FloatingPointError(
            f"{what}; lower the learning rate (lr={self.config.lr}) or enable clipping; "
            f"{self.kept(loss_at)}"
        )

    # -- evaluation and checkpoints ---------------------------------------------------------

    def evaluate(self) -> None:
        from ..progress import progress_enabled

        t0 = _now()
        if self.is_main:
            abortable = self.abortable
            guard = abortable() if callable(abortable) else contextlib.nullcontext()
            devices = [self.device] if self.device.type == "cuda" else []
            try:
                with guard, progress_enabled(self.show):
                    with torch.random.fork_rng(devices=devices):
                        result = self.task.evaluate(
                            self.module,
                            self.config.eval_split,
                            device=self.device,
                            autocast=self.autocast(),
                        )
            except KeyboardInterrupt:
                if not self.stop_requested():
                    raise
                logger.warning("evaluation at step %d abandoned (interrupted)", self.step)
                result = None
            if result is not None:
                record: dict[str, Any] = {"step": self.step}
                record.update({f"{self.split_prefix}_{k}": v for k, v in result.items()})
                self.history.evals.append(record)
                self.metrics.write(record)
                logger.info(
                    "step %d: %s %s %.4f",
                    self.step,
                    self.config.eval_split,
                    self.metric,
                    result.get(self.metric, math.nan),
                )
        if self.d.active:
            dist.barrier()
        if not self.config.time_budget_counts_eval:
            self.excluded += _now() - t0
        self.last_eval = self.step

    def checkpoint(self) -> None:
        if self.out_dir is None:
            return
        with torch.no_grad():
            finite = all(bool(torch.isfinite(p).all()) for p in self.module.parameters())
        if not finite:  # never save weights a diverging update broke
            raise self.diverged(f"the weights are not finite after step {self.step}")
        t0 = _now()
        path = save_checkpoint(
            self.out_dir,
            self.step,
            self.module,
            self.optimizer,
            self.scheduler,
            self.task,
            self.states,
            self.config,
            self.d,
            self.plan,
        )
        if path is not None:
            self.history.checkpoint = str(path)
        if not self.config.time_budget_counts_eval:
            self.excluded += _now() - t0
        self.last_ckpt = self.step

    # -- one optimiser step -----------------------------------------------------------------

    def step_once(self) -> dict[str, Any]:
        """Draw the next global batch, differentiate each micro-batch, clip, step the optimiser
        and the schedule, apply buffer updates; returns the step's record."""
        d, device, config, module = self.d, self.device, self.config, self.module
        t0 = time.perf_counter()
        batch = next(self.batches)
        micro = batch.split(self.accum) if self.accum > 1 else [batch]
        weighting = micro_scales(micro, d, device)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        aux_sum = torch.zeros((), dtype=torch.float64, device=device)
        updates: list[dict[str, Tensor]] = []
        for m, mb in enumerate(micro):
            if device.type != "cpu":  # the model checks ids on CPU itself
                check_batch_ids(mb, self.vocab_size)
            mb = mb.to(device)
            if self.init_state is not None and (self.states[m] is None or mb.new_stream):
                self.states[m] = self.init_state(mb.rows, device)
            last = m == self.accum - 1
            sync = self.runner.no_sync() if d.active and not last else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    out = self.task.forward(self.runner, mb, self.states[m])
                    total = out.total_loss
                if weighting is None:
                    (total / self.accum).backward()
                else:
                    (total * weighting[0][m]).backward()
            self.states[m] = map_tensors(out.state, lambda t: t.detach())
            if weighting is None:
                loss_sum += out.loss.detach().double()
                aux_sum += (total - out.loss).detach().double()
            else:  # weighted sums; divided by the all-reduced weight below
                w = weighting[1][m]
                loss_sum += out.loss.detach().double() * w
                aux_sum += (total - out.loss).detach().double() * w
            if out.updates:
                updates.append(out.updates)
        norms = None
        if config.clip is not None and config.optimizer != "adagrad-clip":
            norms = clip_gradients(module, config.clip)
            for what, n in (("", norms.task), ("aux ", norms.aux), ("own ", norms.own)):
                if n is not None and not math.isfinite(n):  # raise before the update
                    raise self.diverged(f"the {what}gradient norm is {n} at step {self.step + 1}")
        self.optimizer.step()
        self.scheduler.step()
        after_optimizer_step(module)
        if self.apply_updates is not None:
            avg = average_updates(updates, d)
            if avg:
                self.apply_updates(avg)
        if weighting is None:
            stats = torch.stack([loss_sum, aux_sum]) / self.accum
            if d.active:
                dist.all_reduce(stats)
                stats = stats / d.world
        else:
            stats = torch.stack([loss_sum, aux_sum])
            if d.active:
                dist.all_reduce(stats)
            stats = stats / weighting[2]
        loss, aux = (float(v) for v in stats.tolist())
        self.step += 1
        self.history.step = self.step
        if not math.isfinite(loss):
            raise self.diverged(f"the training loss is {loss} at step {self.step}", self.step)
        dt = time.perf_counter() - t0
        record: dict[str, Any] = {
            "step": self.step,
            "loss": loss,
            "lr": lr,
            "tokens_per_s": batch.num_tokens * d.world / dt,
            "step_s": dt,
        }
        if weighting is not None:
            record["loss_weight"] = weighting[2]  # what the loss averaged over
        if updates or aux:
            record["total_loss"] = loss + aux
        if norms is not None:
            record["grad_norm"] = norms.task
            if norms.aux is not None:
                record["aux_grad_norm"] = norms.aux
            if norms.own is not None:
                record["own_grad_norm"] = norms.own
        return record

    # -- the loop -----------------------------------------------------------------------------

    def _should_stop(self, t_loop: float) -> tuple[bool, float]:
        """(interrupted, budget seconds spent), agreed by every rank."""
        checks = []
        if self.stop is not None:
            checks.append(float(self.stop_requested()))
        if self.config.time_budget is not None:
            checks.append(_now() - t_loop - self.excluded)
        checks = agree(checks, self.d, self.device) if checks else checks
        interrupted = bool(checks.pop(0)) if self.stop is not None else False
        return interrupted, (checks[0] if checks else 0.0)

    def run(self) -> TrainHistory:
        from tqdm.contrib.logging import logging_redirect_tqdm

        from ..progress import TqdmLoggingHandler, progress_bar, progress_enabled

        config, history = self.config, self.history
        if self.step >= self.limit:
            logger.info("already at step %d of %d: nothing to train", self.step, int(self.limit))
        planner = BudgetPlanner(config, self.plan, self.step)
        with progress_enabled(self.show):
            bar = progress_bar(
                None if math.isinf(self.limit) else int(self.limit),
                initial=self.step,
                desc="train",
                unit="step",
                leave=True,
            )
        # tqdm's redirect swaps console handlers for its own; a handler that already writes
        # through tqdm (the command line's) stays, and redirecting beside it printed every line
        # twice
        routed = any(isinstance(h, TqdmLoggingHandler) for h in logging.getLogger().handlers)
        redirect = logging_redirect_tqdm() if self.show and not routed else contextlib.nullcontext()
        t_loop = _now()
        interrupted = False
        with redirect:
            try:
                while self.step < self.limit:
                    interrupted, elapsed = self._should_stop(t_loop)
                    if interrupted:
                        break
                    if config.time_budget is not None and elapsed >= config.time_budget:
                        history.stop_reason = "time_budget"
                        break
                    if planner.active and self.step > planner.start:
                        plan = planner.after_step(self.step, elapsed)
                        if plan is not None:
                            history.schedule.append(plan)
                            self.metrics.write(plan)
                            bar.total = plan["total_steps"]
                            bar.refresh()
                    record = self.step_once()
                    history.train.append(record)
                    if self.step % config.log_every == 0:
                        self.metrics.write(record)
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{record['loss']:.4f}",
                        tok_s=f"{record['tokens_per_s']:,.0f}",
                        refresh=False,
                    )
                    if config.eval_every is not None and self.step % config.eval_every == 0:
                        self.evaluate()
                    if (
                        config.checkpoint_every is not None
                        and self.step % config.checkpoint_every == 0
                    ):
                        self.checkpoint()
            finally:
                bar.close()
            if history.stop_reason == "time_budget":
                plan = planner.finish(self.step)
                if plan is not None:
                    history.schedule.append(plan)
                    self.metrics.write(plan)
            if interrupted:
                logger.info("stopping at step %d (interrupted)", self.step)
            elif self.last_eval != self.step:
                self.evaluate()
            if interrupted or self.stop_requested():
                history.stop_reason = "interrupted"
            if self.last_ckpt != self.step:
                self.checkpoint()
        history.seconds = time.monotonic() - self.t_begin
        return history
