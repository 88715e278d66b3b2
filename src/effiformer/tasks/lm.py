"""Language modelling: next-token prediction on a :class:`~effiformer.data.Corpus`.

Training batches: models with recurrent memory (``model.init_state(...)`` is not ``None``: XL,
Compressive, ...) get contiguous streams (:class:`~effiformer.data.StreamBatcher`, Transformer-XL's
ordered iterator) so memory carries over from one batch to the next; stateless models get
non-overlapping windows in a shuffled order (:class:`~effiformer.data.WindowBatcher`). Either
way the global batch is ``(batch_size, seq_len)`` and each DDP rank takes a contiguous block of
its rows (row ``b`` of every batch goes to the same rank, so streams stay on one rank).

Only causal models: a bidirectional encoder (``causal=False``) would see the token it is asked to
predict, so :meth:`LMTask.check_model` refuses it (train it with the masked-LM task).

Evaluation-time settings (``eval_overrides``): runtime fields of the model's config that change no
weight (``mem_len``, ``clamp_len``, ``same_length``, ``cmem_len``): every evaluation runs on
:func:`~effiformer.models.transformer_xl.reconfigure` of the trained model with them, as
Transformer-XL evaluates with a longer memory than it trains with.

Metric: ``corpus.metric``; bits per character/byte ``bpc = nats / ln 2`` for byte and char
corpora, perplexity ``ppl = exp(nats)`` for word corpora, where ``nats`` is the mean negative
log-likelihood per predicted token over the evaluated split. Evaluation walks the split as
contiguous streams (:func:`~effiformer.data.eval_batches`) carrying recurrent state; stateless
models see each ``seq_len`` window without earlier context (non-overlapping evaluation).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import CheckpointError, load_checkpoint, load_config
from ..config import ConfigError, ModelConfig, parse_overrides, replace_config
from ..data import (
    FORMATS,
    Corpus,
    StreamBatcher,
    Vocab,
    WindowBatcher,
    embedded_corpus,
    eval_batches,
    load_corpus,
)
from ..models.base import ModelOutput
from ..models.transformer_xl import reconfigure
from ..progress import progress_bar, status
from ..registry import build_model, get_config, get_spec
from .base import Batch, rank_rows, resolve_device, restore_position
from .registry import BuildContext, EvalReport, TaskSetup, flag_of, register_task, task_option

__all__ = [
    "LMTask",
    "LMOptions",
    "LMEvalOptions",
    "RUNTIME_OPTIONS",
    "build_lm",
    "check_runtime_overrides",
    "evaluate_lm",
    "load_lm_corpus",
]

logger = logging.getLogger(__name__)

#: Config fields an LM can be evaluated with other values of, without touching its weights.
RUNTIME_OPTIONS = ("mem_len", "clamp_len", "same_length", "cmem_len")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class LMTask:
    """Language modelling on ``corpus``.

    ``batch_size``: rows of the global batch per optimiser step (split across DDP ranks and
    accumulation micro-steps); ``seq_len``: tokens per row; ``seed``: window shuffling;
    ``stream``: force contiguous streams (True) or shuffled windows (False), default by model;
    ``eval_batch_size``: rows of the evaluation streams; ``eval_tokens``: evaluate on only the
    first ``eval_tokens`` tokens of a split (None: all of it); ``data_spec``: how the corpus was
    loaded (``{"path": .., "format": ..}``, None for the embedded corpus), recorded in checkpoints;
    ``eval_overrides``: runtime config fields to evaluate with (see the module docstring).
    """

    def __init__(
        self,
        corpus: Corpus,
        *,
        batch_size: int = 16,
        seq_len: int = 128,
        seed: int = 0,
        stream: bool | None = None,
        eval_batch_size: int = 8,
        eval_tokens: int | None = None,
        data_spec: dict[str, str] | None = None,
        eval_overrides: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(corpus, Corpus):
            raise TypeError(
                f"corpus must be an effiformer.data.Corpus, got {type(corpus).__name__}"
            )
        self.corpus = corpus
        self.batch_size = _positive_int("batch_size", batch_size)
        self.seq_len = _positive_int("seq_len", seq_len)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.stream = stream
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        if eval_tokens is not None:
            _positive_int("eval_tokens", eval_tokens)
        self.eval_tokens = eval_tokens
        self.data_spec = data_spec
        bad = sorted(set(eval_overrides or {}) - set(RUNTIME_OPTIONS))
        if bad:
            raise ValueError(
                f"eval_overrides takes only runtime fields {list(RUNTIME_OPTIONS)}, got {bad}"
            )
        self.eval_overrides = dict(eval_overrides or {})
        self.metric_name: str = corpus.metric
        self._batcher: StreamBatcher | WindowBatcher | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def vocab(self):
        return self.corpus.vocab

    @staticmethod
    def check_causal(config: ModelConfig, *, name: str = "the model") -> None:
        """Refuse a bidirectional encoder (``config.causal`` False): it would see the token it
        is asked to predict."""
        if getattr(config, "causal", True) is False:
            raise ValueError(
                f"{name} is a bidirectional encoder (causal=False): next-token prediction would "
                "see the target; train it with --task mlm"
            )

    def check_model(self, model: nn.Module, *, name: str | None = None) -> None:
        """Refuse a model this task cannot train: a bidirectional encoder (``causal=False``), a
        vocabulary smaller than the corpus's, rows longer than the model's ``seq_len``.
        ``name`` (a registered name) is what the messages call the model."""
        config = getattr(model, "config", None)
        if config is None:
            return
        self.check_causal(config, name=name or f"the {type(model).__name__}")
        if config.vocab_size < self.corpus.vocab.size:
            raise ValueError(
                f"the corpus {self.corpus.name!r} has {self.corpus.vocab.size} token types but the "
                f"model's vocab_size is {config.vocab_size}; build the model with "
                f"vocab_size={self.corpus.vocab.size}"
            )
        if self.seq_len > config.seq_len:
            raise ValueError(
                f"seq_len={self.seq_len} exceeds the model's seq_len={config.seq_len}; "
                "train on shorter rows or build the model with a larger seq_len"
            )

    def _stateful(self, model: nn.Module) -> bool:
        if self.stream is not None:
            return self.stream
        init_state = getattr(model, "init_state", None)
        return init_state is not None and init_state(1) is not None

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        """This rank's rows of each global batch: ``input_ids``/``targets`` of shape (B/world, T)."""
        self.check_model(model)
        lo, rows = rank_rows(self.batch_size, rank, world)
        if self._stateful(model):
            batcher: StreamBatcher | WindowBatcher = StreamBatcher(
                self.corpus.train, self.batch_size, self.seq_len
            )
        else:
            batcher = WindowBatcher(self.corpus.train, self.batch_size, self.seq_len, self.seed)
        kind = "stream" if isinstance(batcher, StreamBatcher) else "window"
        if self._pending is not None:
            if self._pending["batcher"] != kind:
                raise ValueError(
                    f"the saved data position is for {self._pending['batcher']} batches but this "
                    f"model trains on {kind} batches"
                )
            restore_position(batcher, self._pending["position"])
            self._pending = None
        self._batcher = batcher

        def _iterate() -> Iterator[Batch]:
            while True:
                new_stream = kind == "stream" and batcher.position == 0
                x, y = next(batcher)  # (B, T) each
                yield Batch(
                    {"input_ids": x[lo : lo + rows], "targets": y[lo : lo + rows]},  # (B/world, T)
                    new_stream=new_stream,
                )

        return _iterate()

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput:
        x, y = batch.data["input_ids"], batch.data["targets"]
        if state is None:
            return model(x, targets=y)
        return model(x, targets=y, state=state)

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """``{metric_name: .., "loss": nats per token, "tokens": targets scored}`` over ``split``."""
        if self.eval_overrides:
            model = reconfigure(model, **self.eval_overrides)
        data = self.corpus.split(split)
        if self.eval_tokens is not None:
            data = data[: self.eval_tokens + 1]
        # As many rows as keep every stream at least one full window long.
        rows = max(1, min(self.eval_batch_size, data.numel() // (self.seq_len + 1)))
        was_training = model.training
        model.eval()
        init_state = getattr(model, "init_state", None)
        state = init_state(rows, device) if init_state is not None else None
        total = 0.0
        count = 0
        n_batches = -(-(data.numel() // rows - 1) // self.seq_len)
        bar = progress_bar(n_batches, desc=f"eval {split}", unit="batch")
        try:
            for x, y in eval_batches(data, rows, self.seq_len):  # (rows, T_i) each
                x, y = x.to(device), y.to(device)
                with autocast if autocast is not None else contextlib.nullcontext():
                    out = self.forward(model, Batch({"input_ids": x, "targets": y}), state)
                state = out.state
                total += float(out.loss.double()) * y.numel()
                count += y.numel()
                bar.update(1)
        finally:
            bar.close()
            model.train(was_training)
        loss = total / count
        value = math.exp(loss) if self.metric_name == "ppl" else loss / math.log(2)
        return {self.metric_name: value, "loss": loss, "tokens": count}

    def state_dict(self) -> dict[str, Any]:
        if self._batcher is not None:
            kind = "stream" if isinstance(self._batcher, StreamBatcher) else "window"
            position: dict[str, int] | None = self._batcher.state_dict()
        elif self._pending is not None:
            kind, position = self._pending["batcher"], self._pending["position"]
        else:
            kind, position = None, None
        return {"fingerprint": self.corpus.fingerprint, "batcher": kind, "position": position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the data position saved by :meth:`state_dict` (applied by ``train_batches``)."""
        if state.get("fingerprint") != self.corpus.fingerprint:
            raise ValueError(
                f"the saved data position is for a corpus with fingerprint "
                f"{state.get('fingerprint')!r}, but this corpus ({self.corpus.name}) has "
                f"fingerprint {self.corpus.fingerprint!r}; resume on the same data"
            )
        self._batcher = None
        self._pending = None if state.get("batcher") is None else dict(state)

    def describe(self) -> dict[str, Any]:
        c = self.corpus
        return {
            "task": "lm",
            "corpus": c.name,
            "unit": c.unit,
            "metric": c.metric,
            "fingerprint": c.fingerprint,
            "source": c.source,
            "vocab_size": c.vocab.size,
            "data": self.data_spec,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "eval_batch_size": self.eval_batch_size,
            "eval_tokens": self.eval_tokens,
            "eval_overrides": self.eval_overrides,
        }

    def artifacts(self) -> dict[str, bytes]:
        return {"vocab.json": self.corpus.vocab.to_json().encode()}

    def __repr__(self) -> str:
        return (
            f"LMTask(corpus={self.corpus.name!r}, metric={self.metric_name!r}, "
            f"batch_size={self.batch_size}, seq_len={self.seq_len}, seed={self.seed})"
        )


# ------------------------------------------------------------------------------------------------
# Registration: options, builder and checkpoint evaluation of the "lm" task
# ------------------------------------------------------------------------------------------------


def _check_nonneg(name: str, value: Any, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _check_positive_opt(name: str, value: Any) -> None:
    if value is not None:
        _positive_int(name, value)


@dataclass(frozen=True, kw_only=True)
class LMOptions:
    """Options of the ``lm`` task (``effiformer train NAME [--task lm]``)."""

    data: str | None = task_option(
        None, "corpus path (default: the embedded Python stdlib corpus)", metavar="PATH"
    )
    format: str | None = task_option(None, "corpus format of --data", choices=FORMATS)
    batch: int = task_option(16, "global batch size in rows")
    seq_len: int | None = task_option(None, "tokens per row (default: the model's seq_len)")
    eval_tokens: int = task_option(
        100_000, "evaluate on the first N tokens of the split; 0 = all", metavar="N"
    )
    eval_mem_len: int | None = task_option(
        None, "evaluate with this memory length (the trained model reconfigured; XL, Compressive)"
    )
    eval_clamp_len: int | None = task_option(
        None, "evaluate with relative distances clamped at this length (XL, Compressive)"
    )
    eval_same_length: bool | None = task_option(
        None, "evaluate with every query seeing the same number of keys (XL, Compressive)"
    )
    eval_cmem_len: int | None = task_option(
        None, "evaluate with this compressed-memory length (Compressive)"
    )

    def __post_init__(self) -> None:
        _positive_int("batch", self.batch)
        _check_positive_opt("seq_len", self.seq_len)
        _check_nonneg("eval_tokens", self.eval_tokens, allow_none=False)
        for name in ("eval_mem_len", "eval_clamp_len", "eval_cmem_len"):
            _check_nonneg(name, getattr(self, name))

    @property
    def eval_overrides(self) -> dict[str, Any]:
        """The runtime config fields to evaluate with (the ``eval_*`` options that are set)."""
        values = {k: getattr(self, f"eval_{k}") for k in RUNTIME_OPTIONS}
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class LMEvalOptions:
    """Options of ``effiformer eval`` for a checkpoint of the ``lm`` task."""

    data: str | None = task_option(
        None, "corpus path (default: the corpus recorded at training)", metavar="PATH"
    )
    format: str | None = task_option(None, "corpus format of --data", choices=FORMATS)
    seq_len: int | None = task_option(None, "evaluation window (default: the training seq_len)")
    mem_len: int | None = task_option(None, "memory length for models with memory (XL, ...)")
    clamp_len: int | None = task_option(
        None, "clamp relative distances at this length (XL, Compressive)"
    )
    same_length: bool | None = task_option(
        None, "every query sees the same number of keys (XL, Compressive)"
    )
    cmem_len: int | None = task_option(None, "compressed-memory length (Compressive)")
    batch: int | None = task_option(None, "evaluation streams (default: as in training)")
    eval_tokens: int | None = task_option(
        None, "evaluate only the first N tokens (default: all)", metavar="N"
    )
    allow_other_corpus: bool = task_option(
        False,
        "evaluate on a corpus whose fingerprint differs from the training one (the vocabulary "
        "must still be identical)",
    )

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch", "eval_tokens"):
            _check_positive_opt(name, getattr(self, name))
        for name in ("mem_len", "clamp_len", "cmem_len"):
            _check_nonneg(name, getattr(self, name))

    @property
    def overrides(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in RUNTIME_OPTIONS}
        return {k: v for k, v in values.items() if v is not None}


def load_lm_corpus(data: str | None, fmt: str | None) -> tuple[Corpus, dict[str, str] | None]:
    """The corpus at ``data`` in format ``fmt`` and how it was loaded, or the embedded corpus
    (and ``None``) when ``data`` is ``None``."""
    if data is None:
        if fmt is not None:
            raise ValueError("--format needs --data PATH")
        with status("reading the embedded corpus (the Python standard library's sources)", logger):
            return embedded_corpus(), None
    if fmt is None:
        raise ValueError(f"--data needs --format (one of {', '.join(FORMATS)})")
    with status(f"reading the {fmt} corpus {data}", logger):
        corpus = load_corpus(data, fmt)
    return corpus, {"path": str(Path(data).resolve()), "format": fmt}


def check_runtime_overrides(
    config: ModelConfig, overrides: dict[str, Any], *, options: type, prefix: str = ""
) -> dict[str, Any]:
    """``overrides`` if ``config`` has every field they set; else a ``ValueError`` naming the
    flag (field ``prefix + name`` of ``options``) and the runtime fields the config does have."""
    have = [k for k in RUNTIME_OPTIONS if k in type(config).field_names()]
    for k in overrides:
        if k not in have:
            raise ValueError(
                f"{flag_of(options, prefix + k)}: the {config.family} model "
                f"({type(config).__name__}) has no {k}; its runtime settings: "
                f"{', '.join(have) or 'none'}"
            )
    return dict(overrides)


def build_lm(options: LMOptions, context: BuildContext) -> TaskSetup:
    """The ``lm`` task: the corpus (or the embedded one), the registered model ``context.model_name``
    with ``vocab_size`` from the corpus and the ``--set`` overrides (a resumed run: the
    checkpoint's config), and the :class:`LMTask`."""
    name = context.model_name
    if context.resume is not None:
        base = load_config(context.resume)
    elif name is None:
        raise ValueError("give a registered model NAME (or --resume DIR)")
    else:
        base = get_spec(name).config
    overrides = parse_overrides(base, context.overrides)
    LMTask.check_causal(replace_config(base, **overrides), name=str(name))
    corpus, data_spec = load_lm_corpus(options.data, options.format)
    if "vocab_size" in overrides and overrides["vocab_size"] != corpus.vocab.size:
        raise ConfigError(
            f"--set vocab_size={overrides['vocab_size']} disagrees with the corpus "
            f"{corpus.name!r}, which has {corpus.vocab.size} token types (vocab_size is set from "
            "the corpus; drop the override)"
        )
    if context.resume is None:
        overrides["vocab_size"] = corpus.vocab.size
        model_config = get_config(name, **overrides)
    else:
        model_config = replace_config(base, **overrides) if overrides else base
    eval_overrides = check_runtime_overrides(
        model_config, options.eval_overrides, options=LMOptions, prefix="eval_"
    )
    torch.manual_seed(context.seed)
    model = build_model(model_config)
    task = LMTask(
        corpus,
        batch_size=options.batch,
        seq_len=options.seq_len or model_config.seq_len,
        seed=context.seed,
        eval_tokens=options.eval_tokens or None,
        data_spec=data_spec,
        eval_overrides=eval_overrides,
    )
    task.check_model(model, name=name)
    return TaskSetup(task=task, model=model, model_name=str(name), data_name=corpus.name)


def evaluate_lm(
    checkpoint: Path,
    meta: dict[str, Any],
    options: LMEvalOptions,
    *,
    split: str = "valid",
    device: str = "auto",
) -> EvalReport:
    """Score an ``lm`` checkpoint on a split of its corpus (or ``options.data``), with the runtime
    settings of ``options`` (``load_checkpoint(..., overrides=...)``). A corpus whose fingerprint
    differs from the training one is refused unless ``allow_other_corpus``; one whose vocabulary
    differs always is."""
    if split not in ("train", "valid", "test"):
        raise ValueError(f"split must be 'train', 'valid' or 'test', got {split!r}")
    dev = resolve_device(device)
    overrides = check_runtime_overrides(
        load_config(checkpoint), options.overrides, options=LMEvalOptions
    )
    model, meta = load_checkpoint(checkpoint, map_location=dev, overrides=overrides or None)
    model.to(dev)
    saved_task = meta.get("task", {})
    vocab_path = checkpoint / "vocab.json"
    if not vocab_path.is_file():
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} has no vocab.json")
    vocab = Vocab.from_json(vocab_path.read_text())
    saved_data = saved_task.get("data") or {}
    data = options.data if options.data is not None else saved_data.get("path")
    fmt = options.format if options.data is not None else saved_data.get("format")
    corpus, _ = load_lm_corpus(data, fmt)
    if corpus.fingerprint != saved_task.get("fingerprint"):
        msg = (
            f"the corpus {corpus.name!r} (fingerprint {corpus.fingerprint}) is not the one "
            f"{str(checkpoint)!r} was trained on ({saved_task.get('corpus')!r}, fingerprint "
            f"{saved_task.get('fingerprint')})"
        )
        if not options.allow_other_corpus:
            raise CheckpointError(msg + "; pass --allow-other-corpus to evaluate anyway")
        logger.warning("%s", msg)
    if corpus.vocab != vocab:
        raise CheckpointError(
            f"the corpus vocabulary ({corpus.vocab}) differs from the checkpoint's ({vocab}); "
            "ids would mean different tokens"
        )
    task = LMTask(
        corpus,
        batch_size=1,
        seq_len=options.seq_len or saved_task.get("seq_len") or model.config.seq_len,
        eval_batch_size=options.batch or saved_task.get("eval_batch_size") or 8,
        eval_tokens=options.eval_tokens,
    )
    task.check_model(model, name=meta.get("model_name"))
    result = task.evaluate(model, split, device=dev)
    record = {
        "checkpoint": str(checkpoint),
        "step": meta.get("step"),
        "model": meta.get("model_name"),
        "corpus": corpus.name,
        "fingerprint": corpus.fingerprint,
        "split": split,
        "seq_len": task.seq_len,
        **({"overrides": overrides} if overrides else {}),
        **result,
    }
    summary = (
        f"{meta.get('model_name')} step {meta.get('step')}: {split} "
        f"{task.metric_name} {result[task.metric_name]:.4f} "
        f"(loss {result['loss']:.4f} nats/token over {result['tokens']} tokens of {corpus.name}"
        + (f"; {json.dumps(overrides)}" if overrides else "")
        + ")"
    )
    return EvalReport(record=record, summary=summary)


register_task(
    "lm",
    LMOptions,
    build_lm,
    description="language modelling on --data/--format or the embedded corpus",
    eval_options=LMEvalOptions,
    evaluate=evaluate_lm,
)
