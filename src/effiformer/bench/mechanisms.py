"""The attention mechanisms the quality suite trains and the default benchmark set times, each
with its paper's settings for a task and a length (``mechanism_settings``). A module of its own
below both :mod:`.quality` and :mod:`.harness`, which each read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MECHANISMS", "Mechanism", "mechanism_settings"]


@dataclass(frozen=True)
class Mechanism:
    """A row of the suite: the model ``family`` it builds (``vanilla`` with an attention part, or
    a family of its own), the task kinds it fits and its attention settings for a length."""

    name: str
    family: str
    kinds: tuple[str, ...]
    attention: Callable[[str, int], dict[str, Any] | None]
    note: str = ""
    #: in the default selection; ablations (a setting changed to test why a row is weak) run
    #: only when named with ``--attention``
    default: bool = True
    #: model config overrides of a ``vanilla`` row (an ablation of the model around the part)
    model: tuple[tuple[str, Any], ...] = ()


def _pow2_sqrt(t: int) -> int:
    """The power of two nearest sqrt(t) (Sparse Transformer: stride l ~ sqrt(n))."""
    return max(2, 2 ** round(math.log2(math.sqrt(t))))


def _window(task: str, t: int) -> int:
    """Local window: 32 tokens on the synthetic tasks (MQAR pairs then lie beyond it from
    T = 256 on), T / 8 for language modelling (128 at T = 1,024)."""
    return max(16, t // 8) if task.startswith("lm") else min(32, t // 2)


def _chunk(task: str, t: int) -> int:
    """LSH chunk length: 64 (the Reformer default) where the sequence holds at least 4 chunks,
    else t / 4."""
    return 64 if t >= 256 else max(4, t // 4)


MECHANISMS: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism("dense", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "dense"}, "softmax attention (SDPA)"),
        Mechanism("local", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "local", "window": _window(task, t)},
                  "own block and the previous one"),
        Mechanism("sparse-strided", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "sparse", "pattern": "strided",
                                   "stride": _pow2_sqrt(t)}, "stride l ~ sqrt(T)"),
        Mechanism("sparse-fixed", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "sparse", "pattern": "fixed", "stride": _pow2_sqrt(t),
                                   "summary": max(1, _pow2_sqrt(t) // 4)},
                  "l ~ sqrt(T), c = l/4"),
        Mechanism("adaptive-span", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "adaptive_span", "max_span": t},
                  "spans learned up to T; key_pe its only positions (no absolute embeddings, as "
                  "the official model)", model=(("positions", "none"),)),
        Mechanism("routing", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "routing", "window": _window(task, t)},
                  "half the heads local, half routed, sqrt(T) clusters"),
        Mechanism("lsh", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "lsh", "chunk_len": _chunk(task, t), "n_hashes": 2},
                  "shared-QK LSH, 2 hashes"),
        Mechanism("lsra", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "lsra"}, "half attention, half lightweight conv"),
        Mechanism("relative-xl", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "relative_xl"},
                  "XL relative positions only (no absolute embeddings, as Transformer-XL), no "
                  "memory", model=(("positions", "none"),)),
        Mechanism("xl", "xl", ("lm",), lambda task, t: None,
                  "Transformer-XL: segment S (T/2 unless the budget names it), memory T - S"),
        Mechanism("compressive", "compressive", ("lm",), lambda task, t: None,
                  "Compressive: segment S (T/2 unless the budget names it), memory and compressed memory (T - S)/2 each (compression rate 2, compressive-tiny's)"),
        Mechanism("funnel", "funnel", ("bidirectional",), lambda task, t: None,
                  "Funnel encoder, pooled blocks"),
        # ablations: one setting changed, to test an explanation of a weak row
        Mechanism("adaptive-span-full", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "adaptive_span", "max_span": t, "init_span": 1.0},
                  "ablation of adaptive-span-abspos: spans start at S instead of 0",
                  default=False),
        Mechanism("adaptive-span-self", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "adaptive_span", "max_span": t, "include_self": True},
                  "ablation of adaptive-span-abspos: a query also attends to itself (the paper's "
                  "keys are the previous positions only)", default=False),
        Mechanism("adaptive-span-pe0", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "adaptive_span", "max_span": t, "key_pe_std": 0.0},
                  "ablation of adaptive-span-abspos: key_pe starts at zero instead of N(0, 1)",
                  default=False),
        Mechanism("dense-nobias", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "dense", "bias": False},
                  "ablation: dense without Q/K/V/O biases (relative-XL's projections have none)",
                  default=False),
        Mechanism("relative-xl-abspos", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "relative_xl"},
                  "ablation: the vanilla model's learned absolute positions added under the "
                  "relative terms (the row before 2026-12-07, fifth session)", default=False),
        Mechanism("relative-xl-r0", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "relative_xl", "r_init_std": 0.0},
                  "ablation of relative-xl-abspos: W_{k,R} starts at zero (the position terms "
                  "start at zero) instead of the model's weight init", default=False),
        Mechanism("adaptive-span-abspos", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "adaptive_span", "max_span": t},
                  "ablation: the vanilla model's learned absolute positions added under key_pe "
                  "(the row before 2026-12-08)", default=False),
        Mechanism("adaptive-span-dense", "vanilla", ("causal", "lm"),
                  lambda task, t: {"name": "adaptive_span", "max_span": t, "init_span": 1.0,
                                   "include_self": True, "key_pe_std": 0.0, "penalty": 0.0},
                  "ablation of adaptive-span-abspos: dense at initialisation (spans at S, the "
                  "query's own position, key_pe at zero, no span loss); what still differs: no "
                  "projection biases, "
                  "key_pe and the spans train", default=False),
        Mechanism("dense-sinusoidal", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "dense"},
                  "ablation: sinusoidal instead of learned absolute positions",
                  default=False, model=(("positions", "sinusoidal"),)),
        Mechanism("routing-local", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "routing", "window": _window(task, t),
                                   "routing_heads": 0},
                  "ablation: every head local, through the routing part", default=False),
        Mechanism("routing-mute", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "routing", "window": _window(task, t),
                                   "mute_routed": True},
                  "ablation: the routed heads' output zeroed (the local heads alone, same "
                  "parameters)", default=False),
        Mechanism("routing-nopos", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "routing", "window": _window(task, t)},
                  "ablation: no absolute position embeddings and no relative tables (routing-rel "
                  "without its tables: the queries carry no position)", default=False,
                  model=(("positions", "none"),)),
        Mechanism("routing-rel", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "routing", "window": _window(task, t),
                                   "max_relative_position": 2 * _window(task, t)},
                  "ablation: the released models' positions: relative key and value tables in "
                  "both head types (M = 2 x window, every distance of a local block; official "
                  "513 for blocks of 256) and no absolute embeddings", default=False,
                  model=(("positions", "none"),)),
        Mechanism("routing-wide", "vanilla", ("causal", "bidirectional", "lm"),
                  lambda task, t: {"name": "routing", "window": _window(task, t), "clusters": 4},
                  "ablation: 4 clusters of T/4 tokens instead of sqrt(T) of sqrt(T)",
                  default=False),
    )
}  # fmt: skip


def mechanism_settings(mechanism: str, task: str, length: int) -> dict[str, Any] | None:
    """The attention settings ``mechanism`` takes on ``task`` at ``length`` (None: its family
    has its own attention)."""
    return MECHANISMS[mechanism].attention(task, length)
