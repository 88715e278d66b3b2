"""What controls a training run besides its steps: a schedule sized from the time budget, a
graceful stop request (Ctrl-C through the CLI), micro-batches weighed by their target tokens
(uneven splits), a diverging run that keeps its last checkpoint, and two processes through the
CLI agreeing on one checkpoint."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import effiformer.train.loop as train_loop
from effiformer import create_model
from effiformer.checkpoint import LATEST, load_checkpoint, resolve_checkpoint, verify_checkpoint
from effiformer.data import ParallelData, read_text
from effiformer.tasks import Batch, LMTask
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
SEQ = 16


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny ops: one intra-op thread is far faster than two on a loaded shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) for _ in range(900)]
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n".join(lines) + "\n")
    return read_text(path)


def _model(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return create_model("vanilla-tiny", **overrides)


def _task(corpus, batch_size: int = 2) -> LMTask:
    return LMTask(corpus, batch_size=batch_size, seq_len=SEQ, seed=0, eval_tokens=128)


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=6, lr=3e-3, warmup=2, eval_every=None, progress=False, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


class _StepClock:
    """A budget clock that advances 0.1 s per training forward (deterministic, never timed)."""

    def __init__(self, task, seconds_per_step: float = 0.1) -> None:
        self.steps = 0
        self.dt = seconds_per_step
        forward = task.forward

        def counting(model, *args, **kwargs):
            self.steps += model.training
            return forward(model, *args, **kwargs)

        task.forward = counting

    def __call__(self) -> float:
        return self.steps * self.dt


# ------------------------------------------------------------------------------------------------
# the schedule sized from the time budget
# ------------------------------------------------------------------------------------------------


def test_a_20_s_budget_sizes_warmup_and_decay_to_fit(corpus, tmp_path, monkeypatch):
    """steps=None: the first steps are timed (0.1 s each on this clock), the schedule is sized to
    the 200 steps that fit 20 s, the recipe's warmup of 100 is capped at 10% of them, and the run
    ends at the floor of the cosine, not in warmup (the issue: 16 of 1,000 steps, lr 1.6e-4)."""
    task = _task(corpus)
    monkeypatch.setattr(train_loop, "_now", _StepClock(task))
    out = tmp_path / "run"
    cfg = _cfg(steps=None, time_budget=20.0, warmup=100, lr=1e-3, out_dir=str(out))
    history = train(_model(), task, cfg)
    assert history.stop_reason == "time_budget" and history.step == 200
    first = history.schedule[0]
    assert (first["total_steps"], first["warmup"]) == (200, 20)
    assert first["step_s"] == pytest.approx(0.1) and first["budget_s"] == 20.0
    assert all(r["total_steps"] == 200 for r in history.schedule)  # re-estimates agree
    lrs = [r["lr"] for r in history.train]
    assert max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) == 19  # peak at step 20
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)  # the cosine's floor (min_lr_ratio 0.1)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if "total_steps" in r] == history.schedule

    # A resume without a budget continues the planned schedule (saved in the checkpoint) to its
    # end; from an older checkpoint it reproduces the run.
    older = tmp_path / "older"
    task = _task(corpus)
    monkeypatch.setattr(train_loop, "_now", _StepClock(task))
    cfg2 = _cfg(
        steps=None,
        time_budget=20.0,
        warmup=100,
        lr=1e-3,
        checkpoint_every=100,
        keep_checkpoints=None,
    )
    full = train(_model(), task, TrainConfig(**{**cfg2.to_dict(), "out_dir": str(older)}))
    resumed = train(
        _model(seed=3),
        _task(corpus),
        _cfg(steps=None, warmup=100, lr=1e-3, resume=str(older / "step-00000100")),
    )
    assert [r["step"] for r in resumed.train] == list(range(101, 201))
    assert [r["loss"] for r in resumed.train] == [r["loss"] for r in full.train[100:]]


class _SlowStartClock(_StepClock):
    """The first 10 steps take 0.5 s, the rest 0.1 s (as a run whose first steps warm caches)."""

    def __call__(self) -> float:
        return 0.5 * min(self.steps, 10) + 0.1 * max(self.steps - 10, 0)


def test_the_budget_schedule_ends_where_the_budget_does_when_steps_speed_up(
    corpus, tmp_path, monkeypatch
):
    """Issue 28: ``--time-budget 30`` sized the schedule to 82 steps and stopped at 68, the decay
    unfinished. With slow first steps an average from the start overestimates the step time; the
    planner re-sizes from the steps since its previous sizing and, past 75%, after every step, so
    the run stops at the schedule's end with the lr at the cosine's floor."""
    task = _task(corpus)
    monkeypatch.setattr(train_loop, "_now", _SlowStartClock(task))
    cfg = _cfg(steps=None, time_budget=20.0, warmup=100, lr=1e-3, out_dir=str(tmp_path / "r"))
    history = train(_model(), task, cfg)
    # 10 steps in 5 s, then 150 steps of 0.1 s: 160 steps fit
    assert history.stop_reason == "time_budget" and history.step == 160
    assert history.schedule[0]["total_steps"] < 160  # sized from the slow first steps
    final = history.schedule[-1]
    assert final["final"] and final["total_steps"] == history.step == 160
    assert history.train[-1]["lr"] == pytest.approx(1e-4, rel=0.01)  # the decay finished
    # the run's checkpoint records the schedule as ended: a resume without steps has nothing to do
    again = train(_model(), _task(corpus), _cfg(steps=None, resume=str(tmp_path / "r")))
    assert again.step == 160 and not again.train


def test_a_fixed_schedule_that_cannot_fit_the_budget_is_named(corpus, monkeypatch, caplog):
    task = _task(corpus)
    monkeypatch.setattr(train_loop, "_now", _StepClock(task))
    caplog.set_level(logging.WARNING, logger="effiformer")
    history = train(_model(), task, _cfg(steps=1000, warmup=100, time_budget=2.0))
    assert history.step == 20 and history.stop_reason == "time_budget" and not history.schedule
    assert "fits about 20 steps, fewer than the warmup (100 of 1000 steps)" in caplog.text


def test_steps_none_needs_a_budget():
    from effiformer.config import ConfigError

    with pytest.raises(ConfigError, match="steps=None sizes the schedule from time_budget"):
        TrainConfig(steps=None)


# ------------------------------------------------------------------------------------------------
# graceful stop
# ------------------------------------------------------------------------------------------------


class _Stop:
    """A stop request that turns on in the middle of training step ``at`` (as Ctrl-C would)."""

    def __init__(self, task, at: int) -> None:
        self.requested = False
        self.steps = 0
        forward = task.forward

        def counting(model, *args, **kwargs):
            if model.training:
                self.steps += 1
                if self.steps == at:
                    self.requested = True
            return forward(model, *args, **kwargs)

        task.forward = counting


def test_a_stop_request_finishes_the_step_checkpoints_and_resumes_exactly(corpus, tmp_path):
    cfg = dict(steps=8, eval_every=3, checkpoint_every=100)
    full = train(_model(dropout=0.2), _task(corpus), _cfg(**cfg))
    task = _task(corpus)
    stop = _Stop(task, at=5)
    out = tmp_path / "run"
    part = train(_model(dropout=0.2), task, _cfg(**cfg, out_dir=str(out)), stop=stop)
    assert part.stop_reason == "interrupted" and part.step == 5
    assert (out / LATEST).read_text() == "step-00000005"
    assert [e["step"] for e in part.evals] == [3]  # the final evaluation is skipped
    rest = train(_model(seed=4, dropout=0.2), _task(corpus), _cfg(**cfg, resume=str(out)))
    assert [r["loss"] for r in part.train + rest.train] == [r["loss"] for r in full.train]


class _AbortingStop:
    """A stop whose owner abandons the evaluation in progress (what the CLI's handler does when
    Ctrl-C arrives during an evaluation)."""

    requested = False

    @contextlib.contextmanager
    def abortable(self):
        self.requested = True
        raise KeyboardInterrupt
        yield  # pragma: no cover


def test_an_evaluation_abandoned_by_the_stop_is_dropped_and_the_run_saved(corpus, tmp_path):
    out = tmp_path / "run"
    history = train(
        _model(), _task(corpus), _cfg(steps=6, eval_every=2, out_dir=str(out)), stop=_AbortingStop()
    )
    assert history.stop_reason == "interrupted" and history.step == 2 and not history.evals
    assert verify_checkpoint(resolve_checkpoint(out))["step"] == 2
    # without a stop request, a KeyboardInterrupt is the caller's, as before
    task = _task(corpus)
    forward = task.forward

    def dying(model, *a, **k):
        if not model.training:
            raise KeyboardInterrupt
        return forward(model, *a, **k)

    task.forward = dying
    with pytest.raises(KeyboardInterrupt):
        train(_model(), task, _cfg(steps=4, eval_every=2))


# ------------------------------------------------------------------------------------------------
# micro-batches: uneven splits, weighted by target tokens
# ------------------------------------------------------------------------------------------------


def test_batch_split_is_uneven_keeps_weights_and_equal_splits_are_the_old_slices():
    x = torch.arange(10).view(5, 2)
    b = Batch({"input_ids": x, "targets": x + 1}, weights=torch.tensor([1, 2, 3, 4, 5]))
    parts = b.split(2)
    assert [p.rows for p in parts] == [3, 2] and [p.weight for p in parts] == [6.0, 9.0]
    assert torch.equal(torch.cat([p.data["targets"] for p in parts]), x + 1)
    even = Batch({"input_ids": torch.arange(12).view(6, 2)}).split(3)
    assert [p.data["input_ids"].tolist() for p in even] == [
        [[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]],
    ]  # fmt: skip
    assert even[0].weight is None
    with pytest.raises(ValueError, match="cannot split a batch of 5 rows into 6 micro-batches"):
        b.split(6)
    with pytest.raises(ValueError, match=r"Batch.weights must have shape \(5,\)"):
        Batch({"input_ids": x}, weights=torch.ones(4))


WORDS = {"man": "Mann", "dog": "Hund", "red": "rot", "big": "groß", "runs": "läuft", "a": "ein"}


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    d = tmp_path_factory.mktemp("para")
    rng = random.Random(0)
    for split, n in (("train", 200), ("val", 10), ("test_2016_flickr", 8)):
        src, tgt = [], []
        for _ in range(n):
            ws = [rng.choice(list(WORDS)) for _ in range(rng.randint(1, 9))]
            src.append(" ".join(ws) + ".")
            tgt.append(" ".join(WORDS[w] for w in ws) + ".")
        (d / f"{split}.en").write_text("\n".join(src) + "\n")
        (d / f"{split}.de").write_text("\n".join(tgt) + "\n")
    return d


def _translation(parallel):
    return TranslationTask(ParallelData(parallel, "en", "de"), vocab_size=100, max_tokens=160)


def test_accumulation_weighs_micro_batches_by_target_tokens(parallel, monkeypatch):
    """The loss is a mean over target tokens and micro-batches hold different numbers of them:
    accumulating 2 or 3 micro-batches gives the full batch's loss and gradient norm; weighing
    them equally (the old 1/grad_accum) does not."""

    def run(accum):
        task = _translation(parallel)
        torch.manual_seed(0)
        model = create_model("seq2seq-tiny", vocab_size=task.tokenizer.vocab_size, dropout=0.0)
        h = train(model, task, _cfg(steps=3, grad_accum=accum, clip=1e9, lr=1e-3, warmup=1))
        return torch.tensor([[r["loss"], r["grad_norm"]] for r in h.train], dtype=torch.float64)

    full = run(1)
    for accum in (2, 3):
        torch.testing.assert_close(run(accum), full, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(train_loop, "micro_scales", lambda micro, d, device: None)
    equal = run(2)
    assert not torch.allclose(equal[:, 1], full[:, 1], rtol=1e-3)


# ------------------------------------------------------------------------------------------------
# a diverging run
# ------------------------------------------------------------------------------------------------


def test_a_diverging_run_fails_in_one_line_and_keeps_its_last_checkpoint(tmp_path, capsys):
    from effiformer.cli import main

    out = tmp_path / "div"
    argv = ["train", "vanilla-tiny", "--lr", "50", "--clip", "0", "--steps", "40",
            "--checkpoint-every", "1", "--keep", "2", "--batch", "2", "--seq-len", "16",
            "--eval-every", "0", "--eval-tokens", "256", "--no-progress", "--device", "cpu",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    # the loss went nan, or an update made the weights non-finite (then nothing is saved)
    import re

    assert re.match(
        r"effiformer train: error: (the training loss is nan at step|the weights are not "
        r"finite after step) \d+; lower the learning rate \(lr=50.0\)",
        errors[0],
    ), errors[0]
    ckpt = resolve_checkpoint(out)
    assert f"the last checkpoint, {ckpt}, is unchanged" in errors[0]
    step = verify_checkpoint(ckpt)["step"]
    model, _ = load_checkpoint(ckpt)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert math.isfinite(losses[step + 1])  # the kept weights still gave a finite loss


# ------------------------------------------------------------------------------------------------
# two processes through the CLI
# ------------------------------------------------------------------------------------------------


def test_two_processes_through_the_cli_write_one_checkpoint_and_agree(tmp_path):
    """``torchrun --nproc_per_node 2 -m effiformer train ...`` (gloo, tiny model, 3 steps): one
    checkpoint directory, written once by rank 0 with both ranks' parts, whose parameter
    checksums are equal (DDP kept the replicas identical)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "-m", "effiformer", "train", "vanilla-tiny", "--steps", "3", "--batch", "4",
           "--seq-len", "16", "--eval-every", "0", "--eval-tokens", "256", "--no-progress",
           "--device", "cpu", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained vanilla-tiny") == 1  # rank 0 reports, rank 1 is quiet
    assert sorted(p.name for p in out.iterdir()) == ["latest", "metrics.jsonl", "step-00000003"]
    ckpt = resolve_checkpoint(out)
    assert verify_checkpoint(ckpt)["world"] == 2
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    sums = [r["param_checksum"] for r in state["ranks"]]
    assert len(sums) == 2 and sums[0] == sums[1] and math.isfinite(sums[0])
    model, _ = load_checkpoint(ckpt)
    with torch.no_grad():
        assert sum(p.double().sum().item() for p in model.parameters()) == sums[0]


def test_two_processes_weigh_translation_batches_by_target_tokens(parallel, tmp_path, capsys):
    """Translation batches split into rows of unequal target tokens across 2 ranks (and 2
    micro-batches each): the all-reduced weights make the 2-process run follow the 1-process
    loss and gradient norm of the same global batches."""
    from effiformer.cli import main

    common = ["train", "seq2seq-tiny", "--task", "translation", "--data", str(parallel), "--src",
              "en", "--tgt", "de", "--max-tokens", "160", "--vocab-size", "100", "--steps", "3",
              "--warmup", "1", "--lr", "1e-3", "--clip", "1e9", "--set", "dropout=0.0",
              "--eval-every", "0", "--eval-sentences", "2", "--no-progress", "--device", "cpu"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "-m", "effiformer", *common, "--grad-accum", "2", "--out", str(tmp_path / "two")]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def records(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        steps = [r for r in rows if "loss" in r]
        values = torch.tensor([[r["loss"], r["grad_norm"]] for r in steps], dtype=torch.float64)
        return values, [r.get("loss_weight") for r in steps]

    (one, w_one), (two, w_two) = records("one"), records("two")
    assert one.shape == (3, 2) and w_two == w_one  # the same global batches (target tokens)
    torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-6)
