"""The latency-dataset / predictor / search loop over a registered family's own
hyper-parameters (a causal LM with local attention; Transformer-XL's memory length)."""

import math

import numpy as np
import pytest
import torch

from effiformer import get_config
from effiformer.config import ConfigError, parse_overrides
from effiformer.search.family import (
    FamilySettings,
    FamilySpace,
    build_family_dataset,
    measure_family,
    params_fitness,
    parse_choices,
    predicted_family_latency,
    read_family_csv,
    search_family,
)
from effiformer.search.predictor import train_predictor


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _space():
    fixed = parse_overrides(get_config("vanilla-tiny"), ["attention=local", "seq_len=128"])
    items = ["attention.window=16,32,64", "n_heads=2,3,4", "ffn_dim=64,128", "n_layers=1,2"]
    return FamilySpace.create("vanilla-tiny", parse_choices("vanilla-tiny", items, fixed), fixed)


def test_candidates_are_typed_overrides_and_invalid_ones_are_refused():
    sp = _space()
    assert sp.keys == ["attention.window", "n_heads", "ffn_dim", "n_layers"]
    cand = {"attention.window": 32, "n_heads": 4, "ffn_dim": 128, "n_layers": 2}
    cfg = sp.config(cand)
    assert cfg.attention.name == "local" and cfg.attention.window == 32 and cfg.n_heads == 4
    assert sp.features(cand) == [32.0, 4.0, 128.0, 2.0] and sp.feature_norm() == [64, 4, 128, 2]
    assert not sp.valid({**cand, "n_heads": 3})  # 64 is not divisible by 3 heads
    with pytest.raises(ConfigError):
        parse_choices("vanilla-tiny", ["no_such_key=1,2"])


def _fake(cand):
    return (cand["attention.window"] * 0.01 + cand["ffn_dim"] * 0.02) * cand["n_layers"], 0.0


def test_dataset_resumes_and_skips_invalid_combinations(tmp_path):
    sp = _space()
    s = FamilySettings(seq_len=128, runs=1, warmup=0, seed=2)
    full = build_family_dataset(tmp_path / "a.csv", sp, 30, s, measure=_fake, progress=False)
    assert len(full) == 30 and full.feature_names == sp.keys
    assert all(sp.valid(c) for c in full.candidates) and 3.0 not in full.features[:, 1]
    build_family_dataset(tmp_path / "b.csv", sp, 11, s, measure=_fake, progress=False)
    build_family_dataset(tmp_path / "b.csv", sp, 30, s, measure=_fake, progress=False)
    assert (tmp_path / "b.csv").read_text() == (tmp_path / "a.csv").read_text()
    assert read_family_csv(tmp_path / "a.csv").meta["settings"]["seed"] == 2


def test_real_workloads_are_timed():
    sp = _space()
    cand = {"attention.window": 16, "n_heads": 2, "ffn_dim": 64, "n_layers": 1}
    ms, spread = measure_family(sp, cand, FamilySettings(seq_len=64, runs=2, warmup=1))
    assert ms > 0 and spread >= 0
    xl = FamilySpace.create("xl-tiny", parse_choices("xl-tiny", ["mem_len=8,32"]))
    per_token, _ = measure_family(
        xl, {"mem_len": 32}, FamilySettings(workload="generate", seq_len=16, new_tokens=4, runs=2)
    )
    assert per_token >= 0


def test_search_over_a_family_stays_under_the_limit():
    sp = _space()
    g = torch.Generator().manual_seed(0)
    cands = [c for c in (sp.sample(g) for _ in range(200)) if sp.valid(c)]
    x = np.array([sp.features(c) for c in cands])
    y = np.array([_fake(c)[0] for c in cands])
    pred, _ = train_predictor(x, y, feature_norm=sp.feature_norm(), lat_norm=float(y.max()),
                              steps=300, lr=3e-3, hidden=64)  # fmt: skip
    latency = predicted_family_latency(sp, pred)
    assert math.isinf(latency({"attention.window": 16, "n_heads": 3, "ffn_dim": 64, "n_layers": 1}))
    limit = float(np.median(y))
    r = search_family(sp, pred, limit, params_fitness(sp), population=12, parents=4, mutations=4,
                      crossovers=4, iterations=3)  # fmt: skip
    assert r.best_latency <= limit and sp.valid(r.best)
    assert all(e.latency <= limit for e in r.evaluated)
