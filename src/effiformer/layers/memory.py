"""Memory (FIFO) updates for segment-level recurrence, and the memory policies the layer stack
receives (:class:`MemoryPolicy`, :class:`FIFOMemory`; the Compressive Transformer's is
:class:`effiformer.layers.compression.CompressiveMemory`).

Transformer-XL (Dai et al. 2019, arXiv 1901.02860, sec. 3.2, eq. for h~_{tau+1}^{n-1}): the
memory of layer n for the next segment is the last ``mem_len`` states of
``concat(old memory, this segment's input to layer n)``, wrapped in stop-gradient.

Compressive Transformer (Rae et al. 2019, arXiv 1911.05507, Algorithm 1): the same FIFO, but the
states pushed out of the front (``old_mem``) are handed to the compression function instead of
being discarded.

Deviation from the official code: ``_update_mems`` in kimiyoung/transformer-xl (and the HF ports)
is called with ``qlen`` and ``mlen`` swapped (issues #59, #118; HF #2970, #3580); it is harmless
only because ``ext_len`` is 0. We have no ``ext_len`` and simply keep the last ``mem_len`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..attention.base import AttentionMask

__all__ = ["update_memory", "push_and_evict", "MemoryPolicy", "FIFOMemory", "check_memories"]


def _check(mem: Tensor, h: Tensor) -> None:
    if mem.dim() != 3 or h.dim() != 3 or mem.shape[0] != h.shape[0] or mem.shape[2] != h.shape[2]:
        raise ValueError(
            f"memory (B, M, D) and states (B, T, D) must agree in B and D, got "
            f"{tuple(mem.shape)} and {tuple(h.shape)}"
        )


def update_memory(mem: Tensor, h: Tensor, mem_len: int) -> Tensor:
    """Next memory: last ``mem_len`` rows of ``concat(mem, h)``, detached.

    mem: (B, M, D) (M may be 0); h: (B, T, D) -> (B, min(mem_len, M + T), D).
    """
    _check(mem, h)
    if mem_len < 0:
        raise ValueError(f"mem_len must be >= 0, got {mem_len}")
    cat = h if mem.shape[1] == 0 else _cat(mem, h)  # (B, M + T, D)
    start = max(0, cat.shape[1] - mem_len)
    return cat[:, start:].detach()


def push_and_evict(mem: Tensor, h: Tensor, mem_len: int) -> tuple[Tensor, Tensor]:
    """FIFO push of ``h`` into ``mem`` keeping ``mem_len`` rows, both results detached.

    mem: (B, M, D); h: (B, T, D) -> (new memory (B, min(mem_len, M+T), D),
    evicted (B, max(0, M + T - mem_len), D)), the evicted rows oldest first.
    """
    _check(mem, h)
    if mem_len < 0:
        raise ValueError(f"mem_len must be >= 0, got {mem_len}")
    cat = _cat(mem, h).detach()  # (B, M + T, D)
    split = max(0, cat.shape[1] - mem_len)
    return cat[:, split:], cat[:, :split]


def _cat(a: Tensor, b: Tensor) -> Tensor:
    return torch.cat([a, b], dim=1)  # (B, Ta + Tb, D)


class MemoryPolicy(Protocol):
    """How a :class:`~effiformer.layers.stack.LayerStack` gives each layer a memory.

    The stack calls, for layer ``i`` with input ``x`` (B, T, D) and that layer's memory state:
    ``keys(i, block, x, mem) -> kv`` (B, Tk, D), the states keys and values come from; then
    ``update(i, block, x, kv, mem, mask=, positions=) -> (next memory state, aux losses)``.
    ``window`` is the memory a query may reach beyond its segment as configured (Transformer-XL's
    ``same_length``). States are explicit: ``init_state`` gives the first one, the model returns
    the next in ``ModelOutput.state``; ``full_state`` gives memories at their full configured
    length (what ``bench --part attention`` attends over).
    """

    window: int

    def init_state(
        self, blocks: Sequence[nn.Module], batch: int, dim: int, device: Any, dtype: torch.dtype
    ) -> tuple: ...

    def full_state(
        self, blocks: Sequence[nn.Module], batch: int, dim: int, device: Any, dtype: torch.dtype
    ) -> tuple: ...

    def check_state(
        self, state: Any, n_layers: int, batch: int, dim: int, ref: Tensor
    ) -> tuple: ...

    def keys(self, layer: int, block: nn.Module, x: Tensor, mem: Any) -> Tensor: ...

    def update(
        self,
        layer: int,
        block: nn.Module,
        x: Tensor,
        kv: Tensor,
        mem: Any,
        *,
        mask: AttentionMask,
        positions: Any,
    ) -> tuple[Any, dict[str, Tensor]]: ...


def check_memories(
    state: Any, n_layers: int, batch: int, dim: int, ref: Tensor, *, per_layer: int = 1
) -> tuple:
    """Validate a tuple of ``n_layers`` memories, each a (B, M, D) tensor or, with ``per_layer``
    > 1, a tuple of that many; the error names the layer and what was expected."""
    what = "memories (B, M, D)" if per_layer == 1 else f"tuples of {per_layer} memories"
    if not isinstance(state, (tuple, list)) or len(state) != n_layers:
        raise ValueError(
            f"state must be a tuple of {n_layers} {what} from init_state() or a previous "
            "output's .state"
        )
    out = []
    for i, entry in enumerate(state):
        parts = (entry,) if per_layer == 1 else entry
        if per_layer > 1 and (not isinstance(entry, (tuple, list)) or len(entry) != per_layer):
            raise ValueError(f"state[{i}] must be a tuple of {per_layer} (B, M, {dim}) memories")
        for t in parts:
            if not isinstance(t, Tensor) or t.dim() != 3:
                raise ValueError(f"state[{i}] must hold (B, M, {dim}) tensors")
            if t.shape[0] != batch or t.shape[2] != dim:
                raise ValueError(
                    f"state[{i}] must be (B={batch}, M, D={dim}), got {tuple(t.shape)}"
                )
            if t.dtype != ref.dtype or t.device != ref.device:
                raise ValueError(
                    f"state[{i}] must be {ref.dtype} on {ref.device}, got {t.dtype} on {t.device}"
                )
        out.append(entry if per_layer == 1 else tuple(entry))
    return tuple(out)


class FIFOMemory:
    """Transformer-XL's memory (sec. 3.2): layer ``i`` attends over ``concat(memory, x)`` and
    keeps the last ``mem_len`` of its inputs, detached, for the next segment.

    ``mem_len``: one length for every layer, or one per layer; a layer's attention may keep
    fewer (:meth:`~effiformer.attention.base.AttentionPart.memory_len`: Adaptive Span keeps what
    its current span reaches). The first state is zero-length memories, as the official code.
    """

    def __init__(self, mem_len: int | Sequence[int]) -> None:
        self.mem_len = mem_len

    def length(self, layer: int, block: nn.Module) -> int:
        configured = self.mem_len if isinstance(self.mem_len, int) else self.mem_len[layer]
        attn = getattr(block, "attn", None)
        fn = getattr(attn, "memory_len", None)
        return int(fn(configured)) if callable(fn) else configured

    @property
    def window(self) -> int:
        return self.mem_len if isinstance(self.mem_len, int) else max(self.mem_len, default=0)

    def init_state(self, blocks, batch, dim, device, dtype) -> tuple:
        return tuple(torch.zeros(batch, 0, dim, device=device, dtype=dtype) for _ in blocks)

    def full_state(self, blocks, batch, dim, device, dtype) -> tuple:
        return tuple(
            torch.zeros(batch, self.length(i, b), dim, device=device, dtype=dtype)
            for i, b in enumerate(blocks)
        )

    def check_state(self, state, n_layers, batch, dim, ref) -> tuple:
        return check_memories(state, n_layers, batch, dim, ref)

    def keys(self, layer: int, block: nn.Module, x: Tensor, mem: Tensor) -> Tensor:
        return x if mem.shape[1] == 0 else torch.cat([mem, x], dim=1)  # (B, M + T, D)

    def update(self, layer, block, x, kv, mem, *, mask, positions) -> tuple[Tensor, dict]:
        return update_memory(mem, x, self.length(layer, block)), {}
