"""Frozen configs: validation names the field; overrides are typed and checked."""

import dataclasses

import pytest

from effiformer import ConfigError, create_model, get_config
from effiformer.config import parse_overrides
from effiformer.models import VanillaConfig


def test_configs_are_frozen():
    cfg = get_config("vanilla-tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"dim": 30, "n_heads": 4}, "dim=30 is not divisible by n_heads=4"),
        ({"seq_len": -1}, "seq_len"),
        ({"n_layers": 0}, "n_layers"),
        ({"dropout": 1.5}, "dropout"),
        ({"positions": "rotary"}, "positions"),
        ({"mem_len": -3}, "mem_len"),
    ],
)
def test_invalid_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        get_config("vanilla-tiny", **overrides)


def test_unknown_key_lists_closest_first():
    with pytest.raises(ConfigError) as e:
        create_model("vanilla-tiny", n_head=4)
    assert "valid keys (closest first): n_heads" in str(e.value)


def test_unknown_name_lists_closest_first():
    with pytest.raises(KeyError) as e:
        create_model("vanilla-smal")
    # issue 28: the closest few, not all 51 names
    assert "closest registered names: vanilla-small," in str(e.value)
    assert str(e.value).count(",") == 4 and "`effiformer list` shows all" in str(e.value)


def test_derived_fields_follow_overrides():
    cfg = get_config("vanilla-tiny", dim=128)
    assert cfg.head_dim == 128 // cfg.n_heads and cfg.ffn_dim == 4 * 128
    cfg = get_config("vanilla-tiny", dim=128, head_dim=16)
    assert cfg.head_dim == 16


def test_parse_overrides_types():
    got = parse_overrides(
        VanillaConfig, ["dim=32", "dropout=0.25", "causal=false", "positions=learned"]
    )
    assert got == {"dim": 32, "dropout": 0.25, "causal": False, "positions": "learned"}
    with pytest.raises(ConfigError, match="expects an integer"):
        parse_overrides(VanillaConfig, ["dim=abc"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(VanillaConfig, ["dim"])
    with pytest.raises(ConfigError, match="unknown config key 'dimm'"):
        parse_overrides(VanillaConfig, ["dimm=3"])
