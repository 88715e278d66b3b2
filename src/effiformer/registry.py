"""Registry of named configurations: ``create_model(name, **overrides)``, ``list_models(pattern)``.

A family registers its config class and a builder (a plain function ``config -> nn.Module``) once
with :func:`register_family`; each named configuration is then a frozen config instance registered
with :func:`register_model`. Names are lowercase, hyphenated and matched exactly.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .config import ConfigError, ModelConfig, closest, replace_config

__all__ = [
    "ModelSpec",
    "UnknownModelError",
    "register_family",
    "register_model",
    "create_model",
    "get_config",
    "get_spec",
    "list_models",
    "list_families",
    "build_model",
    "family_config_class",
]

Builder = Callable[[ModelConfig], nn.Module]


class UnknownModelError(KeyError):
    """An unregistered model name; the message lists the registered names, closest first."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    config: ModelConfig
    description: str = ""

    @property
    def family(self) -> str:
        return self.config.family


_FAMILIES: dict[str, tuple[type[ModelConfig], Builder]] = {}
_MODELS: dict[str, ModelSpec] = {}


def register_family(config_cls: type[ModelConfig], builder: Builder) -> None:
    family = config_cls.family
    if family in _FAMILIES and _FAMILIES[family][0] is not config_cls:
        raise ValueError(f"family {family!r} is already registered")
    _FAMILIES[family] = (config_cls, builder)


def register_model(name: str, config: ModelConfig, description: str = "") -> None:
    if name != name.lower() or " " in name or "_" in name:
        raise ValueError(f"model names are lowercase and hyphenated, got {name!r}")
    if name in _MODELS:
        raise ValueError(f"model {name!r} is already registered")
    if config.family not in _FAMILIES:
        raise ValueError(f"register the family {config.family!r} before its models")
    _MODELS[name] = ModelSpec(name=name, config=config, description=description)


def _ensure_loaded() -> None:
    # Families register on import; importing the models package imports each one explicitly.
    from . import models  # noqa: F401


def get_spec(name: str) -> ModelSpec:
    _ensure_loaded()
    if name not in _MODELS:
        names = closest(name, list(_MODELS))
        raise UnknownModelError(
            f"unknown model name {name!r}; closest registered names: {', '.join(names[:5])} "
            f"(`effiformer list` shows all {len(names)})"
        )
    return _MODELS[name]


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The registered config for ``name`` with ``overrides`` applied (unknown keys are errors)."""
    return (
        replace_config(get_spec(name).config, **overrides) if overrides else get_spec(name).config
    )


def family_config_class(family: str) -> type[ModelConfig]:
    _ensure_loaded()
    if family not in _FAMILIES:
        raise ConfigError(f"unknown model family {family!r}; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[family][0]


def build_model(config: ModelConfig) -> nn.Module:
    """Build a model from a config instance of any registered family."""
    _ensure_loaded()
    if config.family not in _FAMILIES:
        raise ConfigError(f"no builder registered for family {config.family!r}")
    model = _FAMILIES[config.family][1](config)
    return model


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build the registered configuration ``name`` with config ``overrides``.

    >>> model = create_model("vanilla-tiny", n_layers=1)
    """
    return build_model(get_config(name, **overrides))


def list_models(pattern: str = "*") -> list[str]:
    """Registered names matching the glob ``pattern``, sorted."""
    _ensure_loaded()
    return sorted(n for n in _MODELS if fnmatch.fnmatchcase(n, pattern))


def list_families() -> list[str]:
    _ensure_loaded()
    return sorted(_FAMILIES)
