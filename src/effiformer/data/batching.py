"""Batching a 1-D token stream for language modelling, with explicit, resumable state.

* :class:`StreamBatcher`: contiguous streams as in Transformer-XL's ``LMOrderedIterator``; row
  ``b`` of batch ``t + 1`` continues row ``b`` of batch ``t`` (for recurrence memory).
* :class:`WindowBatcher`: non-overlapping windows in a fresh random order each epoch,
  deterministic from ``(seed, epoch)``.
* :func:`eval_batches`: contiguous streams over a whole split for bpc / perplexity.

Every batch is a pair ``(x, y)`` of int64 tensors of shape ``(B, T)`` with ``y[b, i]`` the token
that follows ``x[b, i]``. A batcher's only state is ``(epoch, position)``: ``next(batcher)``
returns batch ``position`` of ``epoch`` and advances, wrapping to the next epoch;
``state_dict()`` / ``load_state_dict()`` save and restore it, so a resumed run sees exactly the
batches an uninterrupted one would. ``batch(index, epoch)`` reads any batch without touching
the state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from .corpora import CorpusError

__all__ = ["StreamBatcher", "WindowBatcher", "eval_batches"]


def _check_tokens(data: Tensor) -> Tensor:
    """``data`` as a 1-D int64 tensor, shape ``(N,)``."""
    if not isinstance(data, Tensor):
        raise TypeError(f"data must be a torch.Tensor of token ids, got {type(data).__name__}")
    if data.dim() != 1 or data.is_floating_point() or data.is_complex() or data.dtype == torch.bool:
        raise ValueError(
            f"data must be a 1-D integer tensor of token ids, got shape {tuple(data.shape)} "
            f"{data.dtype}"
        )
    return data.long()


def _check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class _Batcher:
    """Shared state machine: ``(epoch, position)``, ``next()``, ``state_dict()``."""

    _kind = "batcher"

    def __init__(self, data: Tensor, batch_size: int, seq_len: int) -> None:
        self._data = _check_tokens(data)
        self._batch_size = _check_positive("batch_size", batch_size)
        self._seq_len = _check_positive("seq_len", seq_len)
        self._num_batches = 0  # set by subclasses
        self._epoch = 0
        self._position = 0

    @property
    def batch_size(self) -> int:
        """``B``, rows per batch."""
        return self._batch_size

    @property
    def seq_len(self) -> int:
        """``T``, tokens per row."""
        return self._seq_len

    @property
    def epoch(self) -> int:
        """Epoch of the batch the next ``next()`` returns."""
        return self._epoch

    @property
    def position(self) -> int:
        """Index in its epoch of the batch the next ``next()`` returns (0 = a new epoch)."""
        return self._position

    def __len__(self) -> int:
        """Batches per epoch."""
        return self._num_batches

    def batch(self, index: int, epoch: int = 0) -> tuple[Tensor, Tensor]:
        """Batch ``index`` of ``epoch``: ``(x, y)``, each ``(B, T)`` int64. Reads no state."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self):
            raise IndexError(f"batch index must be an int in [0, {len(self)}), got {index!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        return self._batch(index, epoch)

    def _batch(self, index: int, epoch: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        """The batch at ``(epoch, position)``; then advance, wrapping to the next epoch."""
        out = self._batch(self._position, self._epoch)
        self._position += 1
        if self._position == self._num_batches:
            self._epoch, self._position = self._epoch + 1, 0
        return out

    def _config(self) -> dict[str, int]:
        return {
            "batch_size": self._batch_size,
            "seq_len": self._seq_len,
            "num_tokens": self._data.numel(),
        }

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position"}`` plus the configuration the state is valid for."""
        return {"epoch": self._epoch, "position": self._position, **self._config()}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore a :meth:`state_dict`; the configuration must match this batcher's."""
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(
                f"{self._kind} state must have exactly the keys {sorted(expected)}, got {sorted(state)}"
            )
        for key, value in self._config().items():
            if state[key] != value:
                raise ValueError(
                    f"{self._kind} state has {key}={state[key]!r} but this batcher has {key}={value}"
                )
        epoch, position = state["epoch"], state["position"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"state epoch must be an int >= 0, got {epoch!r}")
        if isinstance(position, bool) or not isinstance(position, int):
            raise ValueError(f"state position must be an int, got {position!r}")
        if not 0 <= position < self._num_batches:
            raise ValueError(f"state position must be in [0, {self._num_batches}), got {position}")
        self._epoch, self._position = epoch, position

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_tokens={self._data.numel()}, batch_size={self._batch_size}, "
            f"seq_len={self._seq_len}, batches_per_epoch={len(self)}, epoch={self._epoch}, "
            f"position={self._position})"
        )


class StreamBatcher(_Batcher):
    """Contiguous-stream batches (Transformer-XL's ``LMOrderedIterator``, batch-first).

    ``data`` (shape ``(N,)``) is cut into ``batch_size`` contiguous streams of
    ``L = N // batch_size`` tokens (the last ``N % batch_size`` tokens are dropped): stream ``b``
    is ``data[b * L : (b + 1) * L]``. Batch ``t`` is ``x = streams[:, t*T : t*T + T]`` and
    ``y = streams[:, t*T + 1 : t*T + T + 1]``, both ``(B, T)``, so row ``b`` of batch ``t + 1``
    continues row ``b`` of batch ``t``. An epoch has ``(L - 1) // T`` full batches; the leftover
    tail of each stream is not used for training. Every epoch yields the same batches, so
    ``position == 0`` marks where recurrent memory should be reset.
    """

    _kind = "StreamBatcher"

    def __init__(self, data: Tensor, batch_size: int, seq_len: int) -> None:
        super().__init__(data, batch_size, seq_len)
        n, b, t = self._data.numel(), self._batch_size, self._seq_len
        stream_len = n // b
        if stream_len < t + 1:
            raise CorpusError(
                f"data of {n} tokens is too short for one batch of batch_size={b} contiguous "
                f"streams of seq_len + 1 = {t + 1} tokens (needs at least {b * (t + 1)} tokens)"
            )
        self._streams = self._data[: b * stream_len].view(b, stream_len)  # (B, L)
        self._num_batches = (stream_len - 1) // t

    def _batch(self, index: int, epoch: int) -> tuple[Tensor, Tensor]:
        start = index * self._seq_len
        chunk = self._streams[:, start : start + self._seq_len + 1]  # (B, T + 1)
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


class WindowBatcher(_Batcher):
    """Non-overlapping windows of the stream, shuffled afresh each epoch.

    Window ``w`` is ``data[w*T : w*T + T + 1]`` (``T`` inputs and their ``T`` next tokens; two
    neighbouring windows share one boundary token), for ``w < (N - 1) // T``. Epoch ``e`` visits
    the windows in a permutation drawn from a generator seeded by a hash of ``(seed, e)``; an
    epoch has ``num_windows // B`` batches (the last windows of the permutation are left out).
    The same ``(seed, epoch, index)`` always gives the same batch.
    """

    _kind = "WindowBatcher"

    def __init__(self, data: Tensor, batch_size: int, seq_len: int, seed: int) -> None:
        super().__init__(data, batch_size, seq_len)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self._seed = seed
        n, b, t = self._data.numel(), self._batch_size, self._seq_len
        self._num_windows = (n - 1) // t
        if self._num_windows < b:
            raise CorpusError(
                f"data of {n} tokens is too short for one batch of batch_size={b} windows of "
                f"seq_len={t} tokens plus one target (needs at least {b * t + 1} tokens)"
            )
        self._num_batches = self._num_windows // b
        self._offsets = torch.arange(t + 1)  # (T + 1,)
        self._perm_cache: tuple[int, Tensor] | None = None  # memo only: a function of epoch

    @property
    def seed(self) -> int:
        """Seed of the per-epoch window permutations."""
        return self._seed

    def permutation(self, epoch: int) -> Tensor:
        """Window order of ``epoch``: a permutation of ``range(num_windows)``, shape ``(W,)``."""
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            digest = hashlib.sha256(f"WindowBatcher:{self._seed}:{epoch}".encode()).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            self._perm_cache = (epoch, torch.randperm(self._num_windows, generator=gen))
        return self._perm_cache[1]

    def _batch(self, index: int, epoch: int) -> tuple[Tensor, Tensor]:
        b, t = self._batch_size, self._seq_len
        windows = self.permutation(epoch)[index * b : (index + 1) * b]  # (B,)
        chunk = self._data[windows[:, None] * t + self._offsets]  # (B, T + 1)
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def _config(self) -> dict[str, int]:
        return {**super()._config(), "seed": self._seed}


def eval_batches(data: Tensor, batch_size: int, seq_len: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Contiguous-stream batches covering a whole split, for bpc / perplexity.

    ``data`` (shape ``(N,)``) is cut into ``B = batch_size`` streams of ``L = N // B`` tokens
    (the last ``N % B`` tokens are dropped) and walked ``seq_len`` at a time; the final batch may
    be shorter. Yields ``(x, y)``, each ``(B, T_i)`` with ``T_i <= seq_len``; over all batches the
    targets are every token of every stream but its first, ``B * (L - 1)`` in all (all ``N - 1``
    with ``batch_size=1``). The loss over a split is the sum over these targets divided by that
    count. Row ``b`` of each batch continues row ``b`` of the previous one.
    """
    data = _check_tokens(data)
    _check_positive("batch_size", batch_size)
    _check_positive("seq_len", seq_len)
    n = data.numel()
    stream_len = n // batch_size
    if stream_len < 2:
        raise CorpusError(
            f"data of {n} tokens is too short to evaluate with batch_size={batch_size} streams "
            f"(needs at least {2 * batch_size} tokens, two per stream)"
        )
    streams = data[: batch_size * stream_len].view(batch_size, stream_len)  # (B, L)

    def _walk() -> Iterator[tuple[Tensor, Tensor]]:
        for start in range(0, stream_len - 1, seq_len):
            end = min(start + seq_len, stream_len - 1)
            yield streams[:, start:end].contiguous(), streams[:, start + 1 : end + 1].contiguous()

    return _walk()
