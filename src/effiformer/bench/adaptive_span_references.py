"""Bench rows for Adaptive Attention Span with the spans set by hand: every head's p fixed at a
fraction of S, so one ``effiformer bench`` run shows what the learned spans buy.

``span-0.1s`` (p = 0.1, z = 0.1 S: the learned spans of the paper are a few hundred tokens of
8192), ``span-1.0s`` (p = 1, every head at S: no trimming possible) and ``span-0s`` (p = 0, the
initial spans of about R) stand beside every registered ``adaptive-span-*`` name, whole model
and attention layer, built from the cell's config (``--set`` applied) as the model row, with
``current_val`` overwritten, the whole model against full memories::

    effiformer bench adaptive-span-base --set n_layers=2 --lengths 512 --part both --refs 'span-*'

(built in: :mod:`effiformer.bench` imports this module). The model row itself is the registered
initialisation (p = 0) as the harness runs it, against full memories too.
"""

from __future__ import annotations

import torch

from ..attention.adaptive_span import AdaptiveSpanAttention
from ..registry import build_model, list_models
from .cell import bench_state, model_workload
from .references import CellSpec, Workload, register_reference

__all__ = ["FRACTIONS", "span_workload", "set_spans_"]

#: The rows this module registers: name -> p of every head.
FRACTIONS = {"span-0s": 0.0, "span-0.1s": 0.1, "span-1.0s": 1.0}


@torch.no_grad()
def set_spans_(model: torch.nn.Module, p: float) -> int:
    """Set every adaptive-span head's p to ``p``; returns how many layers were set."""
    n = 0
    for m in model.modules():
        if isinstance(m, AdaptiveSpanAttention):
            m.current_val.fill_(p)
            n += 1
    if not n:
        raise ValueError("the model has no adaptive_span attention layer")
    return n


def span_workload(spec: CellSpec, p: float) -> Workload:
    """The cell's model (``spec.config``) with every span at ``p * S``.

    ``part="attention"``: as the model row (:func:`effiformer.bench.cell.model_workload`, layer
    0 over its full memory). ``part="model"``: one segment of ``seq_len`` tokens against full
    per-layer memories (random states, ``memory_len`` long: what a segment in the middle of a
    stream sees), loss plus the span penalty: the same state as the harness's own model row
    (:func:`effiformer.bench.cell.bench_state`)."""
    model = build_model(spec.config)
    set_spans_(model, p)
    if spec.part != "model" or getattr(model.blocks, "memory", None) is None:
        return model_workload(model, spec)
    model.to(device=spec.device, dtype=spec.dtype).train()
    c = spec.config
    g = torch.Generator(device=spec.device).manual_seed(0)
    ids = torch.randint(
        0, c.vocab_size, (spec.batch, spec.seq_len), device=spec.device, generator=g
    )
    state, info = bench_state(model, spec.batch, spec.device, spec.dtype, g)

    def forward() -> torch.Tensor:
        return model(ids, targets=ids, state=state).total_loss

    return Workload(forward=forward, module=model, info=info)


def _factory(p: float):
    def factory(spec: CellSpec) -> Workload:
        return span_workload(spec, p)

    factory.__qualname__ = f"span_factory_{str(p).replace('.', '_')}"
    return factory


_FACTORIES = {name: _factory(p) for name, p in FRACTIONS.items()}

for _model in list_models("adaptive-span-*"):
    for _name, _p in FRACTIONS.items():
        register_reference(
            _model,
            _FACTORIES[_name],
            name=_name,
            parts=("model", "attention"),
            description=f"the model with every head's span fixed at p = {_p} (z = {_p} S)",
        )
