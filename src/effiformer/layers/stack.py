"""The one loop over blocks that every model runs: :class:`LayerStack`.

For each block (in order, each applied ``repeats[i]`` times: Funnel's weight sharing) the stack

1. asks the memory policy, when it has one, for the block's keys (``kv = memory ++ x``,
   Compressive: ``cmem ++ mem ++ x``) — :mod:`effiformer.layers.memory`;
2. gets the prepared inputs of the block's attention: ``attn.prepare(ctx, shared)`` runs once per
   forward for every group of layers with equal ``attn.prepare_key()`` and equal query/key
   lengths (and once per distinct ``ctx``), its result is handed to every layer of the group as
   ``positions``; ``shared`` is the group's module from ``build_shared`` (parameters the layers
   share, e.g. Transformer-XL's tied u/v), kept in ``self.shared``;
3. lets the memory policy compute the block's next memory and its auxiliary losses;
4. runs the block (``block(x, kv=, mask=, state=, positions=)``), optionally under activation
   checkpointing (``recompute``: the block is re-run in the backward pass with the same RNG
   state and prepared inputs, so the determinism contract of
   :mod:`effiformer.attention.base` makes it exact; updates of the re-run are discarded);
5. collects what the block returns: its attention state (per block, for models without a memory
   policy: decoding caches), aux losses and no-grad buffer updates.

Aux losses and updates are keyed by the block's qualified name relative to the stack
(``"3.span_penalty"``, ``"3.attn.centroids"``); a model prefixes them with the stack's own path
(:func:`prefix_keys`) so that ``ModelOutput.updates`` names buffers of the model
(:meth:`~effiformer.models.base.EffiModel.apply_updates`) and ``ModelOutput.aux`` names losses
per layer. **Both are training-only**: in eval mode the stack returns neither.

Blocks are children named ``"0"``, ``"1"``, ... so checkpoint keys read ``blocks.3.attn...``;
``stack[i]``, ``len(stack)`` and iteration give the blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..attention.base import AttentionMask, PrepareContext
from .memory import MemoryPolicy

__all__ = ["LayerStack", "LayerCall", "StackOutput", "prefix_keys"]


@dataclass
class StackOutput:
    """hidden: (B, Tq, D) output of the last block; state: tuple over blocks of their next
    memory (with a memory policy) or attention state, or ``None`` when every block is stateless;
    aux / updates: by qualified name relative to the stack (training only)."""

    hidden: Tensor
    state: tuple | None = None
    aux: dict[str, Tensor] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class LayerCall:
    """Inputs that replace the stack's for the first application of the first block (Funnel's
    pool-query-only layer: pooled queries over unpooled keys)."""

    kv: Tensor | None = None
    mask: AttentionMask | None = None
    ctx: PrepareContext | None = None


def prefix_keys(d: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {f"{prefix}{k}": v for k, v in d.items()}


def _hashable(n: Any) -> Any:
    """An int as it is; a symbolic size (SymInt) as its expression."""
    return n if isinstance(n, int) else str(n)


def _attn(block: nn.Module) -> nn.Module | None:
    return getattr(block, "attn", None)


class LayerStack(nn.Module):
    """blocks: the blocks, in order; memory: a :class:`~effiformer.layers.memory.MemoryPolicy`
    (held, not owned: modules it uses belong to the model) or ``None``; repeats: times each
    block is applied in a row (default once); recompute: activation checkpointing per block in
    training."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        *,
        memory: MemoryPolicy | None = None,
        repeats: Sequence[int] | None = None,
        recompute: bool = False,
    ) -> None:
        super().__init__()
        blocks = list(blocks)
        for i, b in enumerate(blocks):
            self.add_module(str(i), b)
        self._n = len(blocks)
        self.repeats = tuple(repeats) if repeats is not None else (1,) * self._n
        if len(self.repeats) != self._n or any(r < 1 for r in self.repeats):
            raise ValueError(f"repeats must hold one positive int per block ({self._n})")
        if memory is not None and any(r > 1 for r in self.repeats):
            raise ValueError("a memory policy needs every block applied once (repeats of 1)")
        check = getattr(memory, "check_blocks", None)
        if callable(check):
            check(blocks)
        self.memory = memory
        self.recompute = recompute
        # One shared module per group of layers with the same prepare key.
        self._group_of: list[int | None] = []
        keys: list[Any] = []
        shared: dict[str, nn.Module] = {}
        for b in blocks:
            attn = _attn(b)
            if attn is None or not hasattr(attn, "prepare_key"):
                self._group_of.append(None)
                continue
            key = attn.prepare_key()
            if key not in keys:
                keys.append(key)
                made = type(attn).build_shared(attn.config, attn.dims)
                if made is not None:
                    shared[f"g{len(keys) - 1}"] = made
            self._group_of.append(keys.index(key))
        self.shared = nn.ModuleDict(shared)

    # ---- the blocks as a sequence ----------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> nn.Module:
        if not -self._n <= i < self._n:
            raise IndexError(f"block index {i} out of range for {self._n} blocks")
        return self._modules[str(i % self._n)]  # type: ignore[return-value]

    def __iter__(self) -> Iterator[nn.Module]:
        return (self._modules[str(i)] for i in range(self._n))  # type: ignore[misc]

    def shared_for(self, i: int) -> nn.Module | None:
        g = self._group_of[i]
        return None if g is None else self.shared[f"g{g}"] if f"g{g}" in self.shared else None

    # ---- state -----------------------------------------------------------------------------

    def init_state(self, batch: int, dim: int, device: Any, dtype: torch.dtype) -> tuple | None:
        if self.memory is None:
            return None
        return self.memory.init_state(list(self), batch, dim, device, dtype)

    def check_state(self, state: Any, batch: int, dim: int, ref: Tensor) -> tuple:
        if self.memory is not None:
            return self.memory.check_state(state, self._n, batch, dim, ref)
        if not isinstance(state, (tuple, list)) or len(state) != self._n:
            raise ValueError(
                f"state must be a tuple of {self._n} per-layer states from "
                "init_decoding_state() or a previous output's .state"
            )
        return tuple(state)

    # ---- forward ---------------------------------------------------------------------------

    def _prepared(self, i: int, ctx: PrepareContext, tk: int, cache: dict) -> Any:
        """Block i's prepared inputs for ``ctx`` with ``tk`` keys, computed once per group."""
        attn = _attn(self[i])
        if attn is None or not hasattr(attn, "prepare"):
            return None
        # lengths are SymInts under torch.export/compile with dynamic shapes (unhashable): their
        # expressions name them as well within one trace
        key = (self._group_of[i], id(ctx), _hashable(ctx.tq), _hashable(tk))
        if key not in cache:
            c = ctx if tk == ctx.tk else _with_keys(ctx, tk)
            cache[key] = (attn.prepare(c, self.shared_for(i)), ctx)  # ctx kept alive for id()
        return cache[key][0]

    def forward(
        self,
        x: Tensor,
        *,
        mask: AttentionMask,
        ctx: PrepareContext,
        state: Any = None,
        first: LayerCall | None = None,
        block_kwargs: dict[str, Any] | None = None,
    ) -> StackOutput:
        """x: (B, Tq, D) -> :class:`StackOutput`. ``ctx`` describes this forward for
        ``prepare`` (its ``tk`` is replaced per layer by the key length the memory gives);
        ``state``: per-block memories (with a memory policy) or attention states (decoding
        caches); ``block_kwargs``: extra keyword arguments every block receives (a decoder
        block's encoder output and its padding mask)."""
        if state is not None and len(state) != self._n:
            raise ValueError(f"state must hold one entry per block ({self._n}), got {len(state)}")
        collect = self.training
        cache: dict = {}
        new_states: list[Any] = []
        aux: dict[str, Tensor] = {}
        updates: dict[str, Tensor] = {}
        any_state = False
        applied = 0
        for i, block in enumerate(self):
            entry = None if state is None else state[i]
            mem = entry if self.memory is not None else None
            attn_state = None if self.memory is not None else entry
            for _ in range(self.repeats[i]):
                kv, mask_i, ctx_i = None, mask, ctx
                if first is not None and applied == 0:
                    kv = first.kv
                    mask_i = first.mask if first.mask is not None else mask
                    ctx_i = first.ctx if first.ctx is not None else ctx
                layer_aux: dict[str, Tensor] = {}
                if self.memory is not None:
                    kv = self.memory.keys(i, block, x, mem)
                tk = ctx_i.tk if kv is None else kv.shape[1]  # ctx.tk counts a decoding cache
                positions = self._prepared(i, ctx_i, tk, cache)
                if self.memory is not None:
                    mem, layer_aux = self.memory.update(
                        i, block, x, kv, mem, mask=mask_i, positions=positions
                    )
                out = self._run(block, x, kv, mask_i, attn_state, positions, block_kwargs or {})
                x = out.out
                if self.memory is None:
                    attn_state = out.state
                if collect:
                    for k, v in {**layer_aux, **out.aux}.items():
                        name = f"{i}.{k}"
                        aux[name] = aux[name] + v if name in aux else v
                    updates.update(prefix_keys(out.updates, f"{i}."))
                applied += 1
            entry_out = mem if self.memory is not None else attn_state
            any_state = any_state or entry_out is not None
            new_states.append(entry_out)
        return StackOutput(
            hidden=x,
            state=tuple(new_states) if (any_state or self.memory is not None) else None,
            aux=aux,
            updates=updates,
        )

    def _run(self, block, x, kv, mask, attn_state, positions, extra):
        if not (self.recompute and self.training and torch.is_grad_enabled()):
            return block(x, kv=kv, mask=mask, state=attn_state, positions=positions, **extra)

        def fn(x_: Tensor, kv_: Tensor | None):
            return block(x_, kv=kv_, mask=mask, state=attn_state, positions=positions, **extra)

        return checkpoint(fn, x, kv, use_reentrant=False)


def _with_keys(ctx: PrepareContext, tk: int) -> PrepareContext:
    """``ctx`` for keys of another length (memory ++ segment): default positions."""
    return dataclasses.replace(ctx, tk=tk, q_positions=None, k_positions=None)
