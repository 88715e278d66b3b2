"""The same loop for any registered family: a latency dataset of its own hyper-parameters
measured on this machine, a predictor, and evolutionary search under a latency limit.

HAT searches the widths of one weight-sharing SuperTransformer. A family here is searched over
whatever its config exposes: a causal LM's attention window (``attention.window`` of
``attention=local``), bucket size, cluster count, memory length (``mem_len`` of ``xl-*``), a
Funnel block layout (``block_sizes``), widths and depths. A :class:`FamilySpace` names the
registered model, the choices per config key (dotted ``attention.*`` keys included) and the
fixed overrides; a candidate is a dict of overrides, its features the chosen values (a
categorical choice by its index), and its latency is measured on the workload the user cares
about (:class:`FamilySettings`):

- ``"forward"``: one forward of a ``(batch, seq_len)`` segment in eval mode under
  ``torch.inference_mode`` (a classifier's or an encoder's latency, or the cost of a segment of
  a long-context LM);
- ``"generate"``: per-token generation: ``(t(prompt + n tokens) - t(prompt + 1 token)) /
  (n - 1)`` with :meth:`~effiformer.models.base.EffiModel.generate` (greedy), so a memory or a
  KV cache is what is timed, not the prompt.

Each is ``warmup`` untimed runs then ``runs`` timed ones, the 10-90 % trimmed mean, threads
pinned; the dataset files are the latency module's resumable CSV + sidecar. Combinations the
config refuses (heads that do not divide the width, ...) are redrawn in the dataset and have an
infinite latency in the search, so they are never admitted.

Without weight sharing there is no inherited accuracy to rank candidates by; ``fitness`` is the
caller's: :func:`params_fitness` (the most parameters that fit the limit: a capacity proxy) or
:func:`training_fitness` (the validation loss after a short training of each candidate, the
honest and slow choice, cached per candidate).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..bench.decoding import trimmed_mean, trimmed_std
from ..config import ConfigError, ModelConfig, parse_overrides
from ..models.hat import sample_generator
from ..registry import build_model, get_config
from .evolution import SearchResult, evolve
from .latency import _read_sidecar, _sidecar, machine, resumable_dataset
from .predictor import LatencyPredictor

__all__ = [
    "FamilyData",
    "FamilySettings",
    "FamilySpace",
    "build_family_dataset",
    "measure_family",
    "params_fitness",
    "parse_choices",
    "predicted_family_latency",
    "read_family_csv",
    "search_family",
    "training_fitness",
]

LATENCY_FIELDS = ("latency_ms", "latency_std_ms")


def parse_choices(
    model: str, items: Sequence[str], fixed: Mapping[str, Any] | None = None
) -> dict[str, tuple[Any, ...]]:
    """``["attention.window=64,128,256", "n_heads=4,8"]`` -> typed choices for ``model``'s
    config with ``fixed`` applied (each value parsed as ``--set KEY=VALUE`` would parse it)."""
    base = get_config(model, **dict(fixed or {}))
    out: dict[str, tuple[Any, ...]] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"a choice is KEY=V1,V2,..., got {item!r}")
        key, values = item.split("=", 1)
        key = key.strip()
        parsed = []
        for v in values.split(","):
            over = parse_overrides(base, [f"{key}={v.strip()}"])
            if key.startswith("attention."):
                parsed.append(getattr(over["attention"], key.split(".", 1)[1]))
            else:
                parsed.append(over[key])
        out[key] = tuple(parsed)
    return out


@dataclass(frozen=True)
class FamilySpace:
    """``model``: a registered name; ``choices``: (config key, its choices) pairs, in gene
    order; ``fixed``: (key, value) overrides every candidate shares (e.g. ``attention=local``)."""

    model: str
    choices: tuple[tuple[str, tuple[Any, ...]], ...]
    fixed: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def create(
        cls,
        model: str,
        choices: Mapping[str, Sequence[Any]],
        fixed: Mapping[str, Any] | None = None,
    ) -> FamilySpace:
        if not choices:
            raise ValueError("a family space needs at least one config key with choices")
        get_config(model)  # an unknown name fails here
        ch = tuple((str(k), tuple(v)) for k, v in choices.items())
        for k, v in ch:
            if not v:
                raise ValueError(f"{k} has no choices")
        return cls(model, ch, tuple((fixed or {}).items()))

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self.choices]

    def gene_choices(self) -> list[tuple[Any, ...]]:
        return [v for _, v in self.choices]

    def from_gene(self, gene: Sequence[Any]) -> dict[str, Any]:
        if len(gene) != len(self.choices):
            raise ValueError(f"a gene has {len(self.choices)} values, got {len(gene)}")
        return dict(zip(self.keys, gene))

    def sample(self, generator: torch.Generator | None = None) -> dict[str, Any]:
        return {k: v[int(torch.randint(len(v), (), generator=generator))] for k, v in self.choices}

    def config(self, candidate: Mapping[str, Any]) -> ModelConfig:
        """The candidate's config (``ConfigError`` when the config refuses the combination)."""
        return get_config(self.model, **dict(self.fixed), **dict(candidate))

    def valid(self, candidate: Mapping[str, Any]) -> bool:
        try:
            self.config(candidate)
        except (ConfigError, ValueError):
            return False
        return True

    def features(self, candidate: Mapping[str, Any]) -> list[float]:
        """One number per key: the value (bools 0/1), or its index for a categorical choice."""
        out = []
        for k, opts in self.choices:
            v = candidate[k]
            if isinstance(v, bool):
                out.append(float(v))
            elif isinstance(v, int | float):
                out.append(float(v))
            else:
                out.append(float(opts.index(v)))
        return out

    def feature_norm(self) -> list[float]:
        norms = []
        for _, opts in self.choices:
            if all(isinstance(o, int | float) and not isinstance(o, bool) for o in opts):
                norms.append(max(abs(float(o)) for o in opts) or 1.0)
            else:
                norms.append(float(max(len(opts) - 1, 1)))
        return norms

    def key(self, candidate: Mapping[str, Any]) -> tuple:
        return tuple((k, candidate[k]) for k in self.keys)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "choices": {k: list(v) for k, v in self.choices},
            "fixed": {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in self.fixed},
        }


@dataclass(frozen=True)
class FamilySettings:
    """``workload``: "forward" (one segment) or "generate" (per token); ``seq_len``: the
    segment (forward) or the prompt (generate); ``new_tokens``: generated per timed run;
    ``batch``; ``warmup`` / ``runs``; ``threads``; ``device``; ``seed`` of the draws."""

    workload: str = "forward"
    seq_len: int = 1024
    batch: int = 1
    new_tokens: int = 32
    warmup: int = 2
    runs: int = 10
    threads: int | None = 1
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workload not in ("forward", "generate"):
            raise ValueError(f"workload must be 'forward' or 'generate', got {self.workload!r}")
        if self.workload == "generate" and self.new_tokens < 2:
            raise ValueError("a per-token generation latency needs new_tokens >= 2")
        if self.runs < 1 or self.warmup < 0 or self.seq_len < 1 or self.batch < 1:
            raise ValueError("runs, seq_len and batch must be >= 1 and warmup >= 0")


def _time(fn: Callable[[], Any], warmup: int, runs: int, device: torch.device) -> list[float]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure_family(
    space: FamilySpace, candidate: Mapping[str, Any], settings: FamilySettings = FamilySettings()
) -> tuple[float, float]:
    """(trimmed-mean latency ms, trimmed spread ms) of ``candidate`` on ``settings``'
    workload (see the module docstring); random weights, eval mode, inference mode."""
    s = settings
    config = space.config(candidate)
    if s.workload == "forward" and config.seq_len < s.seq_len:
        raise ValueError(f"the model's seq_len={config.seq_len} is shorter than {s.seq_len}")
    dev = torch.device(s.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(config).to(dev)
    model.eval()
    g = torch.Generator().manual_seed(s.seed)
    ids = torch.randint(0, config.vocab_size, (s.batch, s.seq_len), generator=g).to(dev)
    old = torch.get_num_threads()
    if s.threads is not None:
        torch.set_num_threads(s.threads)
    try:
        with torch.inference_mode():
            if s.workload == "forward":
                times = _time(lambda: model(ids), s.warmup, s.runs, dev)
            else:
                one = _time(lambda: model.generate(ids, 1, temperature=0), s.warmup, s.runs, dev)
                full = _time(
                    lambda: model.generate(ids, s.new_tokens, temperature=0), s.warmup, s.runs, dev
                )
                per = (trimmed_mean(full) - trimmed_mean(one)) / (s.new_tokens - 1)
                spread = math.hypot(trimmed_std(full), trimmed_std(one)) / (s.new_tokens - 1)
                return max(per, 0.0), spread
    finally:
        torch.set_num_threads(old)
    return trimmed_mean(times), trimmed_std(times)


@dataclass
class FamilyData:
    """A family latency dataset: ``features`` (N, K) in ``feature_names`` order, ``latency_ms``,
    ``latency_std_ms``, the ``candidates`` (from the sidecar) and the ``space`` record."""

    features: np.ndarray
    latency_ms: np.ndarray
    latency_std_ms: np.ndarray
    feature_names: list[str]
    candidates: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.features)


def _draw_valid(space: FamilySpace, seed: int, index: int, tries: int = 1000) -> dict[str, Any]:
    g = sample_generator(seed, index)
    for _ in range(tries):
        cand = space.sample(g)
        if space.valid(cand):
            return cand
    raise ValueError(f"no valid configuration among {tries} draws of {space.to_dict()}")


def _jsonable(v: Any) -> Any:
    return v.to_dict() if hasattr(v, "to_dict") else list(v) if isinstance(v, tuple) else v


def build_family_dataset(
    path: str | os.PathLike,
    space: FamilySpace,
    n: int,
    settings: FamilySettings = FamilySettings(),
    *,
    resume: bool = True,
    progress: bool = True,
    measure: Callable[[dict[str, Any]], tuple[float, float]] | None = None,
) -> FamilyData:
    """Measure ``n`` valid candidates of ``space`` into ``path`` (CSV: the choice keys, then
    ``latency_ms``, ``latency_std_ms``; sidecar ``PATH.jsonl``), resumably; row ``i`` is drawn
    from ``(settings.seed, i)``."""
    meta = {
        "settings": asdict(settings),
        "space": space.to_dict(),
        "format": "family-latency-v1",
        "environment": machine(settings.device, settings.threads),
    }
    measure = measure or (lambda cand: measure_family(space, cand, settings))

    def draw(i: int) -> tuple[dict[str, Any], list[float]]:
        cand = _draw_valid(space, settings.seed, i)
        return {"candidate": {k: _jsonable(v) for k, v in cand.items()}}, space.features(cand)

    def run(i: int, record: dict[str, Any]) -> list[float]:
        return list(measure(_draw_valid(space, settings.seed, i)))

    resumable_dataset(
        path, n, meta, [*space.keys, *LATENCY_FIELDS], draw, run,
        resume=resume, progress=progress, total=lambda v: v[0],
    )  # fmt: skip
    return read_family_csv(path)


def read_family_csv(path: str | os.PathLike) -> FamilyData:
    """A dataset :func:`build_family_dataset` wrote."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no latency dataset at {str(path)!r}")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or header[-2:] != list(LATENCY_FIELDS):
            raise ValueError(f"{path}: not a family latency file (it ends in {LATENCY_FIELDS})")
        rows = [[float(v) for v in r] for r in reader if r]
    if not rows:
        raise ValueError(f"{path}: no rows")
    a = np.asarray(rows, dtype=np.float64)
    meta, recs = _read_sidecar(_sidecar(path)) if _sidecar(path).is_file() else (None, [])
    cands = [r["candidate"] for r in recs[: len(a)]]
    return FamilyData(a[:, :-2], a[:, -2], a[:, -1], header[:-2], cands, meta)


def predicted_family_latency(
    space: FamilySpace, predictor: LatencyPredictor
) -> Callable[[Mapping[str, Any]], float]:
    """Candidate -> predicted ms (infinite for a combination the config refuses)."""

    def latency(cand: Mapping[str, Any]) -> float:
        if not space.valid(cand):
            return math.inf
        return float(predictor.predict([space.features(cand)])[0])

    return latency


def params_fitness(space: FamilySpace) -> Callable[[Mapping[str, Any]], float]:
    """Minus the parameter count in millions (the largest model under the limit wins)."""

    def fitness(cand: Mapping[str, Any]) -> float:
        with torch.random.fork_rng(devices=[]):
            model = build_model(space.config(cand))
        return -sum(p.numel() for p in model.parameters()) / 1e6

    return fitness


def training_fitness(
    space: FamilySpace,
    make_task: Callable[[ModelConfig], Any],
    train_config: Any,
    *,
    metric: str = "loss",
    seed: int = 0,
) -> Callable[[Mapping[str, Any]], float]:
    """The validation ``metric`` (lower is better) of each candidate after
    :func:`effiformer.train.train` with ``train_config`` on ``make_task(config)``."""
    from ..train import train

    def fitness(cand: Mapping[str, Any]) -> float:
        config = space.config(cand)
        torch.manual_seed(seed)
        model = build_model(config)
        history = train(model, make_task(config), train_config)
        if not history.evals:
            raise ValueError("the training config must evaluate at the end (eval_split)")
        rec = history.evals[-1]
        value = next((v for k, v in rec.items() if k.endswith("_" + metric)), None)
        if value is None:
            raise KeyError(f"the evaluation has no {metric!r}: {sorted(rec)}")
        return float(value)

    return fitness


def search_family(
    space: FamilySpace,
    latency: LatencyPredictor | Callable[[Mapping[str, Any]], float],
    limit_ms: float,
    fitness: Callable[[Mapping[str, Any]], float],
    **evolution: Any,
) -> SearchResult:
    """The fittest candidate of ``space`` whose predicted latency is at most ``limit_ms``
    (:func:`~effiformer.search.evolution.evolve`'s keywords pass through)."""
    lat = (
        predicted_family_latency(space, latency)
        if isinstance(latency, LatencyPredictor)
        else latency
    )
    return evolve(
        space.gene_choices(), space.from_gene, fitness, lat, limit_ms, key=space.key, **evolution
    )
