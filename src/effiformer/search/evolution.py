"""Evolutionary search under a latency limit (HAT sec. 3.3, official ``fairseq/evolution.py``).

A candidate is a *gene*: one value per entry of ``gene_choices`` (for HAT every width, depth and
per-layer choice of every layer slot of the SuperTransformer, used or not). The search keeps a
population of ``population`` = ``parents`` + ``mutations`` + ``crossovers`` candidates (HAT:
125 = 25 + 50 + 50) for ``iterations`` (30) rounds:

1. score every candidate (``fitness``, lower is better; HAT: the validation loss of the
   SubTransformer with the SuperTransformer's weights) and keep the best ``parents``;
2. ``mutations`` children: a uniformly chosen parent with each gene resampled uniformly with
   probability ``mutation_prob`` (0.3); ``crossovers`` children: two distinct parents, each gene
   taken from either with probability 1/2;
3. **every** candidate (the initial random ones and every child) is redrawn until its
   *predicted* latency is at most ``limit``; after ``max_tries`` draws of one candidate the limit
   is declared infeasible (:class:`InfeasibleLatencyError`, naming the lowest latency seen):
   the official loop would spin forever.

Differences from the official loop: the fitness of a candidate already scored is reused
(``key``), so the parents carried over are not re-evaluated; the children of the last iteration
(which the official code generates and never scores) are not generated. The random generator is
a seeded ``numpy.random.Generator`` instead of Python's global ``random``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Evaluated", "InfeasibleLatencyError", "SearchResult", "evolve"]

logger = logging.getLogger(__name__)


class InfeasibleLatencyError(ValueError):
    """No candidate meeting the latency limit was found in ``max_tries`` draws."""


@dataclass(frozen=True)
class Evaluated:
    """A scored candidate: ``gene``, the decoded ``candidate``, its predicted ``latency`` (ms)
    and ``fitness``."""

    gene: tuple[Any, ...]
    candidate: Any
    latency: float
    fitness: float


@dataclass
class SearchResult:
    """``best``: the fittest candidate of the last scored population (its ``fitness`` and
    predicted ``latency``); ``history``: per iteration ``{"iteration", "best_fitness",
    "best_latency", "parents_fitness", "population": [[latency, fitness], ...]}``;
    ``evaluated``: every distinct candidate scored, in order (the loss-latency cloud);
    ``limit``, ``draws`` (candidates drawn in all, rejections included)."""

    best: Any
    best_gene: tuple[Any, ...]
    best_fitness: float
    best_latency: float
    history: list[dict[str, Any]] = field(default_factory=list)
    evaluated: list[Evaluated] = field(default_factory=list)
    limit: float = math.inf
    draws: int = 0


def evolve(
    gene_choices: Sequence[Sequence[Any]],
    decode: Callable[[Sequence[Any]], Any],
    fitness: Callable[[Any], float],
    latency: Callable[[Any], float],
    limit: float,
    *,
    population: int = 125,
    parents: int = 25,
    mutations: int = 50,
    crossovers: int = 50,
    mutation_prob: float = 0.3,
    iterations: int = 30,
    seed: int = 0,
    max_tries: int = 10_000,
    key: Callable[[Any], Hashable] | None = None,
    progress: bool = False,
) -> SearchResult:
    """Search the genes for the fittest candidate whose predicted ``latency`` is at most
    ``limit`` (see the module docstring). ``decode(gene)`` -> candidate; ``fitness(candidate)``
    -> float, lower is better; ``latency(candidate)`` -> predicted ms; ``key(candidate)``:
    what makes two candidates the same (default: the gene)."""
    if population != parents + mutations + crossovers:
        raise ValueError(
            f"population ({population}) must equal parents + mutations + crossovers "
            f"({parents} + {mutations} + {crossovers})"
        )
    if parents < 1 or (crossovers and parents < 2):
        raise ValueError("need at least one parent (two when there are crossovers)")
    if not 0.0 <= mutation_prob <= 1.0:
        raise ValueError(f"mutation_prob must be in [0, 1], got {mutation_prob}")
    if iterations < 1 or max_tries < 1:
        raise ValueError("iterations and max_tries must be >= 1")
    if not math.isfinite(limit):
        raise ValueError(f"limit must be a finite number of ms, got {limit}")
    choices = [tuple(c) for c in gene_choices]
    if not choices or any(not c for c in choices):
        raise ValueError("every gene needs at least one choice")
    rng = np.random.default_rng(seed)
    key = key or (lambda cand: None)
    lat_cache: dict[Any, float] = {}
    fit_cache: dict[Any, float] = {}
    evaluated: list[Evaluated] = []
    state = {"draws": 0, "lowest": math.inf}

    def ident(gene: tuple, cand: Any) -> Hashable:
        k = key(cand)
        return gene if k is None else k

    def predicted(gene: tuple) -> tuple[Any, float]:
        cand = decode(list(gene))
        k = ident(gene, cand)
        if k not in lat_cache:
            lat_cache[k] = float(latency(cand))
        return cand, lat_cache[k]

    def feasible(make: Callable[[], tuple]) -> tuple:
        for _ in range(max_tries):
            gene = make()
            state["draws"] += 1
            _, lat = predicted(gene)
            state["lowest"] = min(state["lowest"], lat)
            if lat <= limit:
                return gene
        raise InfeasibleLatencyError(
            f"no candidate with a predicted latency <= {limit:g} ms in {max_tries} draws "
            f"(the lowest seen: {state['lowest']:.4g} ms); raise the limit"
        )

    def random_gene() -> tuple:
        return tuple(c[rng.integers(len(c))] for c in choices)

    def mutate(gene: tuple) -> tuple:
        return tuple(
            c[rng.integers(len(c))] if rng.random() < mutation_prob else g
            for g, c in zip(gene, choices)
        )

    def cross(a: tuple, b: tuple) -> tuple:
        return tuple(x if rng.random() < 0.5 else y for x, y in zip(a, b))

    def score(gene: tuple) -> float:
        cand, lat = predicted(gene)
        k = ident(gene, cand)
        if k not in fit_cache:
            fit_cache[k] = float(fitness(cand))
            evaluated.append(Evaluated(gene, cand, lat, fit_cache[k]))
        return fit_cache[k]

    from ..progress import progress_bar, progress_enabled

    popu = [feasible(random_gene) for _ in range(population)]
    history: list[dict[str, Any]] = []
    best_gene: tuple = popu[0]
    best_fit = math.inf
    with progress_enabled(progress):
        bar = progress_bar(iterations, desc="evolve", unit="iteration", leave=True)
    try:
        for it in range(iterations):
            scores = [score(g) for g in popu]
            order = np.argsort(np.asarray(scores), kind="stable")[:parents]
            best_gene, best_fit = popu[order[0]], scores[order[0]]
            par = [popu[i] for i in order]
            history.append(
                {
                    "iteration": it,
                    "best_fitness": best_fit,
                    "best_latency": predicted(best_gene)[1],
                    "parents_fitness": [scores[i] for i in order],
                    "population": [[predicted(g)[1], s] for g, s in zip(popu, scores)],
                }
            )
            logger.info(
                "iteration %d: best fitness %.4f at %.2f ms", it, best_fit, predicted(best_gene)[1]
            )
            bar.update(1)
            bar.set_postfix(best=f"{best_fit:.4f}", refresh=False)
            if it == iterations - 1:
                break

            def mutated(par: list[tuple] = par) -> tuple:
                return mutate(par[rng.integers(len(par))])

            def crossed(par: list[tuple] = par) -> tuple:
                i, j = rng.choice(len(par), size=2, replace=False)
                return cross(par[i], par[j])

            children = [feasible(mutated) for _ in range(mutations)]
            children += [feasible(crossed) for _ in range(crossovers)]
            popu = par + children
    finally:
        bar.close()
    best, best_lat = predicted(best_gene)
    return SearchResult(
        best=best,
        best_gene=best_gene,
        best_fitness=best_fit,
        best_latency=best_lat,
        history=history,
        evaluated=evaluated,
        limit=float(limit),
        draws=state["draws"],
    )
