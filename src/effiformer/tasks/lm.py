"""Language modelling: next-token prediction on a :class:`~effiformer.data.Corpus`.

Training batches: models with recurrent memory (``model.init_state(...)`` is not ``None``: XL,
Compressive, ...) get contiguous streams (:class:`~effiformer.data.StreamBatcher`, Transformer-XL's
ordered iterator) so memory carries over from one batch to the next; stateless models get
non-overlapping windows in a shuffled order (:class:`~effiformer.data.WindowBatcher`). Either
way the global batch is ``(batch_size, seq_len)`` and each DDP rank takes a contiguous block of
its rows (row ``b`` of every batch goes to the same rank, so streams stay on one rank).

Metric: ``corpus.metric``; bits per character/byte ``bpc = nats / ln 2`` for byte and char
corpora, perplexity ``ppl = exp(nats)`` for word corpora, where ``nats`` is the mean negative
log-likelihood per predicted token over the evaluated split. Evaluation walks the split as
contiguous streams (:func:`~effiformer.data.eval_batches`) carrying recurrent state; stateless
models see each ``seq_len`` window without earlier context (non-overlapping evaluation).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from ..data import Corpus, StreamBatcher, WindowBatcher, eval_batches
from ..models.base import ModelOutput
from . import Batch, rank_rows, restore_position

__all__ = ["LMTask"]


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
    loaded (``{"path": .., "format": ..}``, None for the embedded corpus), recorded in checkpoints.
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
        self.metric_name: str = corpus.metric
        self._batcher: StreamBatcher | WindowBatcher | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def vocab(self):
        return self.corpus.vocab

    def _check_model(self, model: nn.Module) -> None:
        config = getattr(model, "config", None)
        if config is None:
            return
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
        self._check_model(model)
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
        try:
            for x, y in eval_batches(data, rows, self.seq_len):  # (rows, T_i) each
                x, y = x.to(device), y.to(device)
                with autocast if autocast is not None else contextlib.nullcontext():
                    out = self.forward(model, Batch({"input_ids": x, "targets": y}), state)
                state = out.state
                total += float(out.loss.double()) * y.numel()
                count += y.numel()
        finally:
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
        }

    def artifacts(self) -> dict[str, bytes]:
        return {"vocab.json": self.corpus.vocab.to_json().encode()}

    def __repr__(self) -> str:
        return (
            f"LMTask(corpus={self.corpus.name!r}, metric={self.metric_name!r}, "
            f"batch_size={self.batch_size}, seq_len={self.seq_len}, seed={self.seed})"
        )
