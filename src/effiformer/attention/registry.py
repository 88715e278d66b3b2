"""Registered attention parts: ``register_attention``, ``build_attention``, ``list_attentions``.

A mechanism file defines its frozen config (a subclass of
:class:`~effiformer.config.AttentionConfig` with ``name = "..."``) and its module (a subclass of
:class:`~effiformer.attention.base.AttentionPart`), then registers them with one line::

    register_attention("local", LocalConfig, LocalAttention, modes=("causal", "bidirectional"))

and :mod:`effiformer.attention` imports the file from its explicit list. Every model whose
config has an ``attention`` field then takes it by configuration
(``create_model("vanilla-small", attention={"name": "local", "window": 64})``,
``--set attention.name=local attention.window=64``), and the contract test
(``tests/attention/test_contract.py``) covers it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from ..config import AttentionConfig, ConfigError, closest
from .base import AttentionDims, AttentionPart

__all__ = [
    "AttentionSpec",
    "MODES",
    "register_attention",
    "get_attention",
    "list_attentions",
    "build_attention",
]

MODES = ("causal", "bidirectional")


@dataclass(frozen=True)
class AttentionSpec:
    """A registered mechanism: its name, config class, module class, the masks it supports
    (``"causal"``, ``"bidirectional"``) and a one-line description."""

    name: str
    config_cls: type[AttentionConfig]
    module_cls: type[AttentionPart]
    modes: tuple[str, ...]
    description: str = ""


_PARTS: dict[str, AttentionSpec] = {}


def register_attention(
    name: str,
    config_cls: type[AttentionConfig],
    module_cls: type[AttentionPart],
    *,
    modes: Iterable[str] = MODES,
    description: str = "",
) -> AttentionSpec:
    """Register a mechanism under ``name`` (lowercase; ``config_cls.name`` must equal it)."""
    if name != name.lower() or " " in name:
        raise ValueError(f"attention names are lowercase without spaces, got {name!r}")
    if getattr(config_cls, "name", None) != name:
        raise ValueError(f"{config_cls.__name__}.name must be {name!r} (it is {config_cls.name!r})")
    if not (isinstance(module_cls, type) and issubclass(module_cls, AttentionPart)):
        raise TypeError(f"{module_cls!r} must subclass effiformer.attention.base.AttentionPart")
    modes = tuple(modes)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be a non-empty subset of {MODES}, got {modes}")
    if name in _PARTS and _PARTS[name].module_cls is not module_cls:
        raise ValueError(f"attention {name!r} is already registered")
    spec = AttentionSpec(name, config_cls, module_cls, modes, description)
    _PARTS[name] = spec
    AttentionConfig._by_name[name] = config_cls
    return spec


def get_attention(name: str) -> AttentionSpec:
    if name not in _PARTS:
        raise ConfigError(
            f"unknown attention {name!r}; registered attention parts (closest first): "
            f"{', '.join(closest(name, _PARTS))}"
        )
    return _PARTS[name]


def list_attentions(pattern: str = "*") -> list[str]:
    """Registered attention names matching the glob ``pattern``, sorted."""
    return sorted(n for n in _PARTS if fnmatch.fnmatchcase(n, pattern))


def build_attention(config: AttentionConfig, dims: AttentionDims) -> nn.Module:
    """The attention module of layer ``dims.layer``: ``config.for_layer(...)``'s mechanism,
    built from that config and ``dims``. Refuses a mode the mechanism does not support."""
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    config = config.for_layer(dims.layer, dims.n_layers)
    spec = get_attention(config.name)
    mode = "causal" if dims.causal else "bidirectional"
    if mode not in spec.modes:
        raise ConfigError(
            f"attention {spec.name!r} supports {' and '.join(spec.modes)} models only, and this "
            f"model is {mode}"
        )
    return spec.module_cls.from_config(config, dims)
