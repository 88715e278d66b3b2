"""Every registered name builds, runs forward and backward, and round-trips a safetensors checkpoint.

Parametrized over the whole registry, so a new family is covered as soon as it registers. Large
paper configurations are shrunk in depth (and sequence/memory length) only; width and vocabulary
stay as registered so the layer shapes and checkpoint keys tested are the real ones.
"""

import math

import pytest
import torch
from torch.testing import assert_close

import effiformer
from effiformer import create_model, get_config, list_models, load_model, save_model
from effiformer.registry import get_spec, list_families

ALL = list_models()


def _shrink(name: str) -> dict:
    cfg = get_config(name)
    fields = cfg.field_names()
    over: dict = {}
    if "block_sizes" in fields:  # Funnel-style: one layer per block, same number of blocks
        over["block_sizes"] = tuple(1 for _ in cfg.block_sizes)
        if "block_repeats" in fields:
            over["block_repeats"] = tuple(1 for _ in cfg.block_repeats)
    elif cfg.n_layers > 2:
        over["n_layers"] = 1
    if cfg.seq_len > 64:
        over["seq_len"] = 64
    if cfg.mem_len > 16:
        over["mem_len"] = 16
    for f in ("cmem_len",):
        if f in fields and getattr(cfg, f) > 16:
            over[f] = 16
    return over


def _inputs(cfg, batch=2):
    t = min(16, cfg.seq_len)
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, cfg.vocab_size, (batch, t), generator=g)


def test_registry_is_not_empty_and_names_are_canonical():
    assert "vanilla-tiny" in ALL
    for name in ALL:
        assert name == name.lower() and " " not in name and "_" not in name


def test_every_family_has_a_tiny_entry():
    for family in list_families():
        names = [n for n in ALL if get_spec(n).family == family]
        assert any(n.endswith("-tiny") for n in names), f"family {family} has no *-tiny entry"


def test_list_models_glob():
    assert list_models("vanilla-*") == ["vanilla-base", "vanilla-small", "vanilla-tiny"]
    assert list_models("no-such-*") == []


@pytest.mark.parametrize("name", ALL)
def test_builds_runs_and_round_trips(name, tmp_path):
    torch.manual_seed(0)
    over = _shrink(name)
    model = create_model(name, **over)
    cfg = model.config
    assert isinstance(model, effiformer.models.EffiModel)
    x = _inputs(cfg)
    model.train()
    out = model(x, targets=x)
    assert out.loss is not None and out.loss.dim() == 0 and math.isfinite(out.loss.item())
    if out.logits is not None:
        assert out.logits.shape[:2] == x.shape
    out.total_loss.backward()
    for pname, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"{name}: {pname} got no gradient"
            assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"

    save_model(model, tmp_path / "ck", name=name)
    loaded = load_model(tmp_path / "ck")
    assert type(loaded) is type(model) and loaded.config == cfg
    model.eval()
    loaded.eval()
    # Seeded: a model may draw randomness in its forward even in eval (LSH rotations).
    torch.manual_seed(1)
    a = model(x, targets=x)
    torch.manual_seed(1)
    b = loaded(x, targets=x)
    assert_close(a.loss, b.loss, rtol=0, atol=0)
    if a.logits is not None:
        assert_close(a.logits, b.logits, rtol=0, atol=0)
    sd_a, sd_b = model.state_dict(), loaded.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k
