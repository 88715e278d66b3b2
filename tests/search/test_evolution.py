"""Evolutionary search under a latency limit: never over the limit, constant population,
HAT's sizes, convergence toward the limit, a clear error on an infeasible one, the HAT glue."""

import pytest
import torch

from effiformer import create_model
from effiformer.models.hat import TINY_SPACE, WMT_SPACE
from effiformer.search.evolution import InfeasibleLatencyError, evolve
from effiformer.search.hat import search_subtransformer, validation_loss
from effiformer.search.macs import decoding_macs, subtransformer_params


def _latency(sub):  # a stand-in predictor: ms proportional to the decoding Mult-Adds
    return decoding_macs(sub, 512).total / 1e7


def _space_search(limit, **kw):
    genes = [c for _, _, c in WMT_SPACE.gene_choices()]
    kw.setdefault("iterations", 6)
    return evolve(
        genes, WMT_SPACE.from_gene, lambda s: -subtransformer_params(s, 512) / 1e6, _latency,
        limit, key=lambda s: s.trimmed(), seed=0, **kw,
    )  # fmt: skip


def test_search_respects_the_limit_keeps_its_population_and_converges():
    lo, hi = _latency(WMT_SPACE.smallest()), _latency(WMT_SPACE.largest())
    limit = lo + 0.4 * (hi - lo)
    r = _space_search(limit)
    assert len(r.history) == 6
    for h in r.history:
        assert len(h["population"]) == 125 and len(h["parents_fitness"]) == 25
        assert all(lat <= limit for lat, _ in h["population"])
    assert all(e.latency <= limit for e in r.evaluated)
    assert r.best_latency <= limit and _latency(r.best) == pytest.approx(r.best_latency)
    fits = [h["best_fitness"] for h in r.history]
    assert fits == sorted(fits, reverse=True)  # elitism: the best never gets worse
    # A mock fitness (more parameters is better) drives the best to the limit.
    assert r.best_latency > 0.9 * limit
    assert r.draws >= 125 + 5 * 100


def test_an_infeasible_limit_is_refused():
    lo = _latency(WMT_SPACE.smallest())
    with pytest.raises(InfeasibleLatencyError, match="lowest seen"):
        _space_search(0.5 * lo, max_tries=200)
    with pytest.raises(ValueError, match="population"):
        _space_search(1e9, population=100)


def test_fitness_is_computed_once_per_distinct_subtransformer():
    calls = []

    def fitness(s):
        calls.append(s.trimmed())
        return -subtransformer_params(s, 512)

    genes = [c for _, _, c in WMT_SPACE.gene_choices()]
    evolve(genes, WMT_SPACE.from_gene, fitness, _latency, 1e12,
           population=10, parents=4, mutations=3, crossovers=3, iterations=3,
           key=lambda s: s.trimmed())  # fmt: skip
    assert len(calls) == len(set(calls))


def test_hat_search_scores_inherited_subtransformers_by_validation_loss():
    torch.manual_seed(0)
    model = create_model("hat-tiny").eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 256, (4, 6), generator=g)
    src[:, -1] = 3
    tgt = torch.randint(4, 256, (4, 5), generator=g)
    tgt[:, -1] = 3
    tin = torch.cat([torch.full((4, 1), 2), tgt[:, :-1]], 1)
    batches = [{"input_ids": src, "tgt_in": tin, "targets": tgt}]
    sub = TINY_SPACE.smallest()
    loss = validation_loss(model, sub, batches)
    assert loss == pytest.approx(model(src, tin, targets=tgt, sample=sub).loss.item(), rel=1e-6)

    def lat(s):
        return decoding_macs(s, TINY_SPACE.qkv_dim).total / 1e4

    limit = 0.5 * (lat(TINY_SPACE.smallest()) + lat(TINY_SPACE.largest()))
    r = search_subtransformer(model, lat, limit, batches, population=8, parents=2, mutations=3,
                              crossovers=3, iterations=2)  # fmt: skip
    assert r.best_latency <= limit and TINY_SPACE.contains(r.best)
    assert r.best_fitness == pytest.approx(validation_loss(model, r.best, batches))
    assert r.best_fitness == min(h["best_fitness"] for h in r.history)


@pytest.mark.parametrize("prob", [0.3, 0.1])
def test_a_mutation_resamples_each_gene_with_the_mutation_probability(prob):
    # issue 23: a mutant that resamples every gene passed every test. 100 genes of 10 choices,
    # one parent, 200 mutated children: a gene differs from the parent's with probability
    # prob * 9/10 (a resample may draw the same value).
    genes = [tuple(range(10))] * 100
    r = evolve(genes, tuple, lambda g: float(sum(g)), lambda g: 0.0, 1.0, population=201,
               parents=1, mutations=200, crossovers=0, iterations=2, mutation_prob=prob, seed=3)  # fmt: skip
    first = r.evaluated[:201]
    parent = min(first, key=lambda e: e.fitness).gene
    children = [e.gene for e in r.evaluated[201:]]
    assert len(children) > 190  # nearly all distinct
    changed = sum(a != b for c in children for a, b in zip(c, parent, strict=True))
    frac = changed / (100 * len(children))
    assert frac == pytest.approx(prob * 0.9, abs=0.02)
