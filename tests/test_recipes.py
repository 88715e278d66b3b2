"""Training recipes: every family registers its paper's recipe, `effiformer train` takes it unless
flags override fields, prints one line saying so, and caps paper warmups on short runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effiformer.cli import main
from effiformer.config import ConfigError
from effiformer.recipes import (
    RECIPE_FIELDS,
    TrainRecipe,
    apply_recipe,
    get_recipe,
    list_recipes,
    register_recipe,
)
from effiformer.registry import list_families
from effiformer.train import TrainConfig


def test_every_family_has_a_recipe():
    assert set(list_families()) <= set(list_recipes())


def test_the_papers_recipes():
    xl = get_recipe("xl")
    assert (xl.optimizer, xl.lr, xl.schedule, xl.min_lr_ratio, xl.warmup) == (
        "adam", 2.5e-4, "cosine", 0.0, 0
    )  # fmt: skip
    assert (xl.clip, xl.weight_decay) == (0.25, 0.0)
    c = get_recipe("compressive")
    assert (c.optimizer, c.lr, c.warmup, c.clip, c.schedule) == ("adam", 3e-4, 4000, 0.1, "cosine")
    assert c.lr * c.min_lr_ratio == pytest.approx(1e-6, rel=1e-12)
    f = get_recipe("funnel")
    assert (f.optimizer, f.lr, f.warmup, f.schedule, f.min_lr_ratio) == (
        "adamw", 1e-4, 10_000, "linear", 0.0
    )  # fmt: skip
    assert (f.weight_decay, f.no_decay, f.eps) == (0.01, "bias-norm", 1e-6)
    # The dense baseline keeps the project's defaults, which TrainConfig() also has.
    v = get_recipe("vanilla")
    defaults = TrainConfig()
    assert {k: getattr(defaults, k) for k in RECIPE_FIELDS} == v.values()


def test_apply_recipe_caps_long_warmups_and_records_overrides():
    f = get_recipe("funnel")
    choice = apply_recipe(f, steps=200)
    assert choice.values["warmup"] == 20 and choice.warmup_capped == (10_000, 20)
    assert {k: v for k, v in choice.values.items() if k != "warmup"} == {
        k: v for k, v in f.values().items() if k != "warmup"
    }  # nothing else changes
    assert "warmup 10000 capped to 20 (10% of this 200-step run)" in choice.describe()
    long = apply_recipe(f, steps=1_000_000)
    assert long.values["warmup"] == 10_000 and long.warmup_capped is None
    given = apply_recipe(f, steps=200, overrides={"warmup": 50, "lr": 3e-4})
    assert given.values["warmup"] == 50 and given.values["lr"] == 3e-4
    assert given.overridden == ("lr", "warmup") and given.warmup_capped is None
    assert apply_recipe(f, steps=5).values["warmup"] == 1  # at least one step
    with pytest.raises(ConfigError, match="not a recipe field"):
        apply_recipe(f, steps=10, overrides={"steps": 3})


def test_recipe_validation_and_registration():
    with pytest.raises(ConfigError, match="optimizer must be one of"):
        TrainRecipe(name="x", source="s", lr=1e-3, optimizer="sgd")
    with pytest.raises(ConfigError, match="schedule must be one of"):
        TrainRecipe(name="x", source="s", lr=1e-3, schedule="step")
    with pytest.raises(ValueError, match="already has a training recipe"):
        register_recipe("xl", TrainRecipe(name="xl", source="elsewhere", lr=1.0))
    with pytest.raises(KeyError, match="no training recipe registered for family 'nope'"):
        get_recipe("nope")


def _train(tmp_path: Path, capsys, *argv: str) -> tuple[str, dict]:
    out = tmp_path / "run"
    rc = main(["train", *argv, "--batch", "2", "--eval-tokens", "64", "--no-progress",
               "--device", "cpu", "--out", str(out)])  # fmt: skip
    stdout = capsys.readouterr().out
    assert rc == 0
    saved = json.loads(next(out.glob("step-*/train_config.json")).read_text())
    return stdout.splitlines()[0], saved


def test_train_prints_the_recipe_line_and_uses_it(tmp_path, capsys):
    line, saved = _train(tmp_path, capsys, "xl-tiny", "--steps", "3")
    assert line == (
        "recipe xl (Dai et al. 2019, run_enwik8_base.sh): Adam lr 0.00025, betas (0.9, 0.999), "
        "eps 1e-08, cosine to 0, warmup 0, clip 0.25, no weight decay"
    )
    assert {k: saved[k] for k in ("optimizer", "lr", "clip", "weight_decay", "schedule")} == {
        "optimizer": "adam", "lr": 2.5e-4, "clip": 0.25, "weight_decay": 0.0, "schedule": "cosine"
    }  # fmt: skip
    assert saved["min_lr_ratio"] == 0.0 and saved["warmup"] == 0


def test_flags_override_recipe_fields_and_are_named(tmp_path, capsys):
    line, saved = _train(
        tmp_path, capsys, "compressive-tiny", "--steps", "2", "--lr", "1e-3", "--clip", "0"
    )
    assert line.startswith("recipe compressive (Rae et al. 2019")
    assert "Adam lr 0.001," in line and "no clipping" in line
    assert "warmup 4000 capped to 1 (10% of this 2-step run)" in line
    assert line.endswith("; overridden: --lr, --clip")
    assert (saved["lr"], saved["clip"], saved["warmup"], saved["optimizer"]) == (
        1e-3, None, 1, "adam"
    )  # fmt: skip


def test_vanilla_keeps_the_project_default(tmp_path, capsys):
    line, saved = _train(tmp_path, capsys, "vanilla-tiny", "--steps", "10", "--seq-len", "16")
    assert line == (
        "recipe vanilla (project default, GPT-2 style): AdamW lr 0.001, betas (0.9, 0.99), "
        "eps 1e-08, cosine to 0.0001, warmup 100 capped to 1 (10% of this 10-step run), clip 1, "
        "weight decay 0.1 (matrices only)"
    )
    # What `effiformer train` did before recipes: warmup min(100, steps // 10), the rest default.
    want = TrainConfig(warmup=1)
    assert {k: saved[k] for k in RECIPE_FIELDS if k != "betas"} == {
        k: getattr(want, k) for k in RECIPE_FIELDS if k != "betas"
    }
    assert tuple(saved["betas"]) == want.betas


def test_sparse_models_train_with_the_sparse_transformer_recipe():
    """Issue 23: the ``sparse-*`` names take Child et al.'s recipe (Adam with weight decay 0.01,
    5,000 warmup steps, clip 1.0, cosine), the rest of the vanilla family the project default."""
    from effiformer.recipes import recipe_for

    for name in ("sparse-tiny", "sparse-small", "sparse-enwik8"):
        r = recipe_for(name, "vanilla")
        assert r.name == "sparse"
        assert (r.optimizer, r.weight_decay, r.warmup, r.clip, r.schedule, r.min_lr_ratio) == (
            "adamw", 0.01, 5000, 1.0, "cosine", 0.0
        )  # fmt: skip
    assert recipe_for("vanilla-small", "vanilla").name == "vanilla"


def test_released_routing_models_train_with_the_official_adafactor_recipe(tmp_path):
    """Issue 23: Adafactor (no momentum, RMS-scaled relative steps) whose min(lr, 1/sqrt(step))
    at lr 0.01 is the official constant*rsqrt_normalized_decay with 10,000 warmup steps;
    WikiText-103 adds weight decay 2e-5. The trainer builds torch's Adafactor from it."""
    import math

    import torch

    from effiformer import create_model
    from effiformer.recipes import recipe_for
    from effiformer.train import TrainConfig, make_optimizer

    for name in ("routing-enwik8", "routing-pg19", "routing-wikitext103"):
        r = recipe_for(name, "vanilla")
        assert (r.optimizer, r.lr, r.warmup, r.schedule, r.clip) == (
            "adafactor", 0.01, 0, "constant", None
        )  # fmt: skip
        assert r.weight_decay == (2e-5 if name == "routing-wikitext103" else 0.0)
    assert recipe_for("routing-small", "vanilla").name == "vanilla"  # ours: the default
    official = [0.01 * math.sqrt(10_000 / max(t, 10_000)) for t in (1, 5_000, 10_000, 40_000)]
    torch_rho = [min(0.01, 1 / math.sqrt(t)) for t in (1, 5_000, 10_000, 40_000)]
    assert official == pytest.approx(torch_rho)
    model = create_model("routing-tiny")
    cfg = TrainConfig(optimizer="adafactor", lr=0.01, weight_decay=2e-5, warmup=0,
                      schedule="constant", clip=None, steps=2)  # fmt: skip
    opt = make_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.Adafactor)
    assert [g["weight_decay"] for g in opt.param_groups] == [2e-5, 0.0]
