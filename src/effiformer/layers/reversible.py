"""Reversible residual layers (Gomez et al. 2017, arXiv 1707.04585; the Reformer, Kitaev et al.
2020, arXiv 2001.04451, sec. 3 "Reversible Transformer"; trax ``ReversibleHalfResidual``,
``ReversibleSwap``, ``ReversibleSerial``).

Two streams: the input ``x`` (B, T, D) is duplicated into ``(x1, x2)`` and every block computes

    Y1 = X1 + F(X2),    F(x) = dropout(Attn(LN1(x)))
    Y2 = X2 + G(Y1),    G(y) = dropout(FFN(LN2(y)))      (run over sequence chunks, optional)

The stack returns ``concat(Y1, Y2)`` (B, T, 2D) of the last block (trax: ``Concatenate`` then a
LayerNorm over 2D in the model). With ``reversible=True`` the stack is one custom autograd
function that keeps only the last block's outputs: its backward walks the blocks top-down and
reconstructs each block's inputs from its outputs (``X2 = Y2 - G(Y1)``, ``X1 = Y1 - F(X2)``),
re-running G and F with gradients, so activation memory does not grow with depth. To make the
re-run exact it

- **replays dropout**: every F and G runs under its own seed, drawn from the global RNG in the
  forward (HF's per-layer seeds; restoring the seeds restores the masks; the global RNG stream
  outside the blocks is untouched);
- **reuses the forward's prepared inputs and discrete choices**: ``prepare`` runs once per
  forward (as in :class:`~effiformer.layers.stack.LayerStack`), and a part that returns
  ``AttentionOutput.replay`` (LSH: its buckets) is re-run with that as ``positions``, so a
  reconstructed input that differs in the last bit cannot flip a hash;
- runs G chunk by chunk in the backward too (recompute a chunk, backpropagate it, next), so the
  FFN intermediate exists for one chunk at a time.

With ``reversible=False`` the same two-stream network (same seeds, same chunks) runs under
ordinary autograd: the reference the custom backward is tested against, and the memory baseline.

What it carries: aux losses (outputs of the function, with their gradients, per layer
``"i.NAME"``) and no-grad updates (``"i.attn.NAME"``), training only, like ``LayerStack``. What it
refuses, with a clear error: per-layer state (decoding caches, memories), memory policies,
repeated blocks, ``first=`` and ``block_kwargs`` inputs (encoder outputs would need their own
gradients), and prepared inputs that require grad (their gradient would be lost).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionMask, AttentionOutput, PrepareContext
from .chunked import chunk_slices
from .stack import LayerStack, StackOutput, prefix_keys

__all__ = ["ReversibleBlock", "ReversibleStack"]


class ReversibleBlock(nn.Module):
    """One reversible block: F = dropout(attn(LN1 x)), G = dropout(ffn(LN2 y)), the FFN run over
    ``ffn_chunk`` positions at a time (``None``: all at once). Receives built parts."""

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        ffn: nn.Module,
        *,
        dropout: float = 0.0,
        norm_eps: float = 1e-5,
        ffn_chunk: int | None = None,
    ) -> None:
        super().__init__()
        if ffn_chunk is not None and (
            isinstance(ffn_chunk, bool) or not isinstance(ffn_chunk, int) or ffn_chunk < 1
        ):
            raise ValueError(f"ffn_chunk must be None or a positive integer, got {ffn_chunk!r}")
        self.attn, self.ffn = attn, ffn
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.drop = nn.Dropout(dropout)
        self.ffn_chunk = ffn_chunk

    def f(self, x2: Tensor, *, mask: AttentionMask | None, positions: Any) -> AttentionOutput:
        """(B, T, D) -> AttentionOutput with out = dropout(attn(LN1 x2)); updates keyed
        ``attn.NAME``."""
        a = self.attn(self.norm1(x2), mask=mask, positions=positions)
        if a.state is not None:
            raise ValueError("a reversible block's attention must not return state")
        updates = {f"attn.{k}": v for k, v in a.updates.items()}
        return AttentionOutput(out=self.drop(a.out), aux=a.aux, updates=updates, replay=a.replay)

    def g_chunk(self, y1: Tensor) -> Tensor:
        """G on one chunk of positions: (B, c, D) -> (B, c, D)."""
        return self.drop(self.ffn(self.norm2(y1)))

    def g(self, y1: Tensor) -> Tensor:
        """G over the sequence, chunk by chunk: (B, T, D) -> (B, T, D)."""
        parts = [self.g_chunk(y1[:, s]) for s in chunk_slices(y1.shape[1], self.ffn_chunk)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def forward(self, x: Tensor, **_: Any) -> AttentionOutput:
        raise TypeError(
            "a ReversibleBlock takes two streams: run it inside ReversibleStack (or call f / g)"
        )


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run with the CPU (and ``device``'s CUDA) RNG seeded by ``seed``, restoring them after."""
    if seed is None:
        yield
        return
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else [], device_type="cuda"):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            idx = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.default_generators[idx].manual_seed(seed)
        yield


def _flatten(obj: Any, out: list[Tensor]) -> Any:
    """``obj`` with its tensors (in dataclasses, tuples, lists, dicts) replaced by their index
    in ``out`` (so they can go through ``save_for_backward``); other objects kept as they are."""
    if isinstance(obj, Tensor):
        out.append(obj)
        return _Slot(len(out) - 1)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _Rebuild(
            obj, {f.name: _flatten(getattr(obj, f.name), out) for f in dataclasses.fields(obj)}
        )
    if isinstance(obj, (tuple, list)):
        return type(obj)(_flatten(v, out) for v in obj)
    if isinstance(obj, dict):
        return {k: _flatten(v, out) for k, v in obj.items()}
    return obj


@dataclasses.dataclass(frozen=True)
class _Slot:
    index: int


@dataclasses.dataclass(frozen=True)
class _Rebuild:
    obj: Any
    fields: dict[str, Any]


def _unflatten(spec: Any, tensors: Sequence[Tensor]) -> Any:
    if isinstance(spec, _Slot):
        return tensors[spec.index]
    if isinstance(spec, _Rebuild):
        values = {k: _unflatten(v, tensors) for k, v in spec.fields.items()}
        return dataclasses.replace(spec.obj, **values)
    if isinstance(spec, (tuple, list)):
        return type(spec)(_unflatten(v, tensors) for v in spec)
    if isinstance(spec, dict):
        return {k: _unflatten(v, tensors) for k, v in spec.items()}
    return spec


def _check_no_grad(obj: Any, i: int) -> None:
    found: list[Tensor] = []
    _flatten(obj, found)
    if any(t.requires_grad for t in found):
        raise ValueError(
            f"block {i}'s prepared inputs hold tensors that require grad; a reversible stack "
            "cannot carry their gradient (use LayerStack for this attention)"
        )


@dataclasses.dataclass
class _Run:
    """One forward's inputs and bookkeeping for the custom function (a per-call object)."""

    blocks: list[ReversibleBlock]
    mask: AttentionMask
    positions: list[Any]
    seeds: list[tuple[int | None, int | None]]
    params: list[nn.Parameter]
    collect: bool
    aux_names: list[list[str]] = dataclasses.field(default_factory=list)
    updates: dict[str, Tensor] = dataclasses.field(default_factory=dict)


def _forward_layers(run: _Run, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, list, list]:
    """The two-stream forward: returns (y1, y2, aux values in order, replays per layer)."""
    aux_values: list[Tensor] = []
    replays: list[Any] = []
    dev = x1.device
    for i, block in enumerate(run.blocks):
        seed_f, seed_g = run.seeds[i]
        with _seeded(seed_f, dev):
            a = block.f(x2, mask=run.mask, positions=run.positions[i])
        y1 = x1 + a.out
        with _seeded(seed_g, dev):
            y2 = x2 + block.g(y1)
        names = sorted(a.aux) if run.collect else []
        run.aux_names.append(names)
        aux_values.extend(a.aux[n] for n in names)
        if run.collect:
            run.updates.update(prefix_keys(a.updates, f"{i}."))
        replays.append(a.replay if a.replay is not None else run.positions[i])
        x1, x2 = y1, y2
    return x1, x2, aux_values, replays


class _Reversible(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1: Tensor, x2: Tensor, run: _Run, *params: Tensor):
        y1, y2, aux, replays = _forward_layers(run, x1, x2)
        saved: list[Tensor] = []
        spec = _flatten(replays, saved)
        ctx.save_for_backward(y1, y2, *saved)
        ctx.run, ctx.spec = run, spec
        ctx.aux_shapes = [(a.shape, a.dtype) for a in aux]
        return (y1, y2, *aux)

    @staticmethod
    def backward(ctx, dy1: Tensor, dy2: Tensor, *daux: Tensor | None):
        y1, y2, *saved = ctx.saved_tensors
        run: _Run = ctx.run
        replays = _unflatten(ctx.spec, saved)
        index = {id(p): j for j, p in enumerate(run.params)}
        grads: list[Tensor | None] = [None] * len(run.params)

        def add(params: list[nn.Parameter], got: Sequence[Tensor | None]) -> None:
            for p, g in zip(params, got):
                if g is None:
                    continue
                j = index[id(p)]
                grads[j] = g if grads[j] is None else grads[j] + g

        dev = y1.device
        dy1 = torch.zeros_like(y1) if dy1 is None else dy1.clone()
        dy2 = torch.zeros_like(y2) if dy2 is None else dy2.clone()
        y1, y2 = y1.detach(), y2.detach()
        offsets, start = [], 0
        for names in run.aux_names:
            offsets.append(start)
            start += len(names)
        for i in range(len(run.blocks) - 1, -1, -1):
            block = run.blocks[i]
            params = [p for p in block.parameters() if p.requires_grad]
            seed_f, seed_g = run.seeds[i]
            # G: X2 = Y2 - G(Y1), chunk by chunk; dY1 += dG/dY1 . dY2
            x2 = torch.empty_like(y2)
            with _seeded(seed_g, dev), torch.enable_grad():
                for s in chunk_slices(y1.shape[1], block.ffn_chunk):
                    y1c = y1[:, s].detach().requires_grad_(True)
                    # a non-leaf view goes into the modules: module hooks that watch their
                    # inputs' gradients (FlopCounterMode's tracker) refuse leaves in autograd.grad
                    gc = block.g_chunk(y1c.view_as(y1c))
                    x2[:, s] = y2[:, s] - gc.detach()
                    got = torch.autograd.grad(gc, (y1c, *params), dy2[:, s], allow_unused=True)
                    if got[0] is not None:
                        dy1[:, s] += got[0]
                    add(params, got[1:])
            # F: X1 = Y1 - F(X2); dX2 = dY2 + dF/dX2 . dY1 (+ the aux losses' gradients)
            with _seeded(seed_f, dev), torch.enable_grad():
                x2g = x2.detach().requires_grad_(True)
                a = block.f(x2g.view_as(x2g), mask=run.mask, positions=replays[i])
                outs, gouts = [a.out], [dy1]
                for k, name in enumerate(run.aux_names[i]):
                    g = daux[offsets[i] + k]
                    value = a.aux[name]
                    if g is not None and value.requires_grad:
                        outs.append(value)
                        gouts.append(g)
                got = torch.autograd.grad(outs, (x2g, *params), gouts, allow_unused=True)
                x1 = y1 - a.out.detach()
            if got[0] is not None:
                dy2 = dy2 + got[0]
            add(params, got[1:])
            y1, y2 = x1, x2
        return (dy1, dy2, None, *grads)


class ReversibleStack(LayerStack):
    """The reversible two-stream stack over :class:`ReversibleBlock` s (see the module
    docstring). ``reversible=False``: the same network under ordinary autograd."""

    def __init__(self, blocks: Sequence[nn.Module], *, reversible: bool = True) -> None:
        blocks = list(blocks)
        for i, b in enumerate(blocks):
            if not isinstance(b, ReversibleBlock):
                raise TypeError(f"block {i} must be a ReversibleBlock, got {type(b).__name__}")
        super().__init__(blocks)
        self.reversible = reversible

    def forward(
        self,
        x: Tensor,
        *,
        mask: AttentionMask,
        ctx: PrepareContext,
        state: Any = None,
        first: Any = None,
        block_kwargs: dict[str, Any] | None = None,
    ) -> StackOutput:
        """x: (B, T, D) -> StackOutput(hidden=concat(Y1, Y2) (B, T, 2D), aux, updates)."""
        if state is not None:
            raise ValueError("a reversible stack carries no per-layer state (pass state=None)")
        if first is not None or block_kwargs:
            raise ValueError("a reversible stack takes neither first= nor block_kwargs")
        if x.dim() != 3:
            raise ValueError(f"x must be (B, T, D), got {tuple(x.shape)}")
        cache: dict = {}
        positions = [self._prepared(i, ctx, x.shape[1], cache) for i in range(len(self))]
        blocks = list(self)
        n = len(blocks)
        if self.training:
            draws = torch.randint(0, 2**62, (2 * n,)).tolist()
            seeds = [(draws[2 * i], draws[2 * i + 1]) for i in range(n)]
        else:
            seeds = [(None, None)] * n
        params = [p for p in self.parameters() if p.requires_grad]
        run = _Run(blocks, mask, positions, seeds, params, collect=self.training)
        grad = torch.is_grad_enabled() and (x.requires_grad or bool(params))
        if self.reversible and grad:
            for i, p in enumerate(positions):
                _check_no_grad(p, i)
            out = _Reversible.apply(x, x, run, *params)
            y1, y2, aux_values = out[0], out[1], list(out[2:])
        else:
            y1, y2, aux_values, _ = _forward_layers(run, x, x)
        aux: dict[str, Tensor] = {}
        k = 0
        for i, names in enumerate(run.aux_names):
            for name in names:
                aux[f"{i}.{name}"] = aux_values[k]
                k += 1
        return StackOutput(hidden=torch.cat([y1, y2], dim=-1), aux=aux, updates=run.updates)
