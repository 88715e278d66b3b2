"""Frozen, keyword-only model configurations shared by every family.

Every family's config subclasses :class:`ModelConfig`, so all of them speak one vocabulary:
``dim``, ``n_heads``, ``head_dim``, ``n_layers``, ``ffn_dim``, ``seq_len``, ``mem_len``,
``vocab_size``, ``causal``. Validation happens in ``__post_init__`` and raises ``ValueError``
naming the field; derived values are filled in there once (``head_dim``, ``ffn_dim``) or exposed
as properties.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, fields
from typing import Any, ClassVar

__all__ = [
    "AttentionConfig",
    "ModelConfig",
    "ConfigError",
    "attention_config",
    "replace_config",
    "parse_overrides",
    "closest",
]


class ConfigError(ValueError):
    """An invalid configuration value or an unknown configuration key."""


def closest(word: str, candidates: typing.Iterable[str]) -> list[str]:
    """All ``candidates`` sorted by similarity to ``word``, closest first."""
    cands = list(candidates)
    return sorted(cands, key=lambda c: (-difflib.SequenceMatcher(None, word, c).ratio(), c))


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """Base of every attention mechanism's frozen config (one subclass per mechanism file).

    A subclass sets the class attribute ``name`` to its registered name and adds the
    mechanism's hyper-parameters as fields (widths, heads and dropout come from the model
    config, through :class:`effiformer.attention.base.AttentionDims`). Validation goes in
    ``__post_init__`` and raises :class:`ConfigError` naming the field.

    ``for_layer(layer, n_layers)`` returns the config that layer ``layer`` builds: the config
    itself by default; a mechanism that varies across layers (interleaved patterns, local layers
    below routing ones) returns another config there.
    """

    name: ClassVar[str] = ""
    _by_name: ClassVar[dict[str, type[AttentionConfig]]] = {}

    def for_layer(self, layer: int, n_layers: int) -> AttentionConfig:
        return self

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., field: value, ...}``: JSON-able, and what :func:`attention_config`
        rebuilds the config from."""
        out: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, AttentionConfig) else v
        return out

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def _check_positive(self, name: str) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"attention.{name} must be a positive integer, got {value!r}")

    def _check_choice(self, name: str, choices: typing.Sequence[str]) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ConfigError(f"attention.{name} must be one of {list(choices)}, got {value!r}")


def _attention_class(name: str) -> type[AttentionConfig]:
    known = AttentionConfig._by_name
    if name not in known:
        raise ConfigError(
            f"unknown attention {name!r}; registered attention parts (closest first): "
            f"{', '.join(closest(name, known)) or '(none loaded)'}"
        )
    return known[name]


def _typed(cls: type, key: str, value: Any, prefix: str = "") -> Any:
    """``value`` converted to the type of field ``key`` of ``cls`` where it arrives as text or
    as JSON (lists for tuples)."""
    hints = typing.get_type_hints(cls)
    tp = hints.get(key)
    if isinstance(value, str) and tp is not None and tp is not str:
        return _convert(value, tp, prefix + key)
    if isinstance(value, list) and _is_tuple_type(tp):
        return tuple(tuple(x) if isinstance(x, list) else x for x in value)
    return value


def attention_config(value: Any, current: AttentionConfig | None = None) -> AttentionConfig:
    """An :class:`AttentionConfig` from a config, a registered name, or a dict.

    A dict may hold ``"name"``; without it (or with ``current``'s name) its keys replace fields
    of ``current``; with another name they build that mechanism's config from its defaults.
    Unknown keys are errors listing the valid ones, closest first.
    """
    if isinstance(value, AttentionConfig):
        return value
    if isinstance(value, str):
        return _attention_class(value)()
    if not isinstance(value, dict):
        raise ConfigError(
            "attention must be an AttentionConfig, a registered attention name or a dict of "
            f"its fields, got {type(value).__name__}"
        )
    items = dict(value)
    name = items.pop("name", None)
    if name is None:
        if current is None:
            raise ConfigError("attention settings need attention.name (no current attention)")
        name = current.name
    cls = _attention_class(name)
    valid = cls.field_names()
    for k in items:
        if k not in valid:
            raise ConfigError(
                f"unknown config key 'attention.{k}' for attention {name!r} "
                f"({cls.__name__}); valid keys (closest first): "
                f"{', '.join('attention.' + c for c in closest(k, valid)) or '(none)'}"
            )
    items = {k: _typed(cls, k, v, "attention.") for k, v in items.items()}
    if current is not None and type(current) is cls:
        return dataclasses.replace(current, **items)
    return cls(**items)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Fields every family shares. Families subclass this and add their own fields.

    ``head_dim`` and ``ffn_dim`` default to ``dim // n_heads`` and ``4 * dim``.
    ``seq_len`` is the longest input a forward pass accepts (the model's limit).
    """

    family: ClassVar[str] = "base"

    vocab_size: int = 256
    dim: int = 256
    n_heads: int = 4
    head_dim: int | None = None
    n_layers: int = 4
    ffn_dim: int | None = None
    seq_len: int = 256
    mem_len: int = 0
    causal: bool = True
    dropout: float = 0.1
    attn_dropout: float = 0.0
    attention: AttentionConfig | None = None

    def __post_init__(self) -> None:
        if self.attention is not None and not isinstance(self.attention, AttentionConfig):
            default = type(self)._default_attention()
            object.__setattr__(self, "attention", attention_config(self.attention, default))
        for name in ("vocab_size", "dim", "n_heads", "n_layers", "seq_len"):
            self._check_positive(name)
        if self.head_dim is None:
            if self.dim % self.n_heads != 0:
                raise ConfigError(
                    f"dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                    "choose dim as a multiple of n_heads or set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        self._check_positive("head_dim")
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", 4 * self.dim)
        self._check_positive("ffn_dim")
        if self.mem_len < 0:
            raise ConfigError(f"mem_len must be >= 0, got {self.mem_len}")
        for name in ("dropout", "attn_dropout"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {p}")

    @property
    def attention_causal(self) -> bool:
        """Whether the layers ``attention`` configures are causal (the model's first
        self-attention, what ``effiformer bench --part attention`` times): ``causal`` here; an
        encoder-decoder's ``attention`` is its encoder's, never causal."""
        return bool(self.causal)

    def _check_positive(self, name: str) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")

    def _check_choice(self, name: str, choices: typing.Sequence[str]) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")

    @property
    def inner_dim(self) -> int:
        """Width of the concatenated heads, ``n_heads * head_dim``."""
        return self.n_heads * self.head_dim  # type: ignore[operator]

    @classmethod
    def _default_attention(cls) -> AttentionConfig | None:
        """The family's default attention config (the ``attention`` field's default)."""
        f = cls.__dataclass_fields__["attention"]
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return f.default_factory()  # type: ignore[misc]
        return None if f.default is dataclasses.MISSING else f.default

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, AttentionConfig):
                out[f.name] = v.to_dict()
            else:
                out[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
        return out

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _split_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"attention.window": 8, "attention.name": "x"}`` -> ``{"attention": {...}}``."""
    out: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for k, v in overrides.items():
        if k.startswith("attention."):
            nested[k.removeprefix("attention.")] = v
        else:
            out[k] = v
    if nested:
        base = out.get("attention")
        if isinstance(base, AttentionConfig):
            base = base.to_dict()
        elif isinstance(base, str):
            base = {"name": base}
        out["attention"] = {**(base or {}), **nested}
    return out


def replace_config(config: ModelConfig, **overrides: Any) -> ModelConfig:
    """``dataclasses.replace`` that rejects unknown keys with the valid ones listed, closest first.

    Derived fields (``head_dim``, ``ffn_dim``) are re-derived when the fields they come from change
    and they were not given explicitly. ``attention`` takes a config, a registered name or a dict
    (see :func:`attention_config`); dotted keys ``attention.FIELD`` change one field of it.
    """
    overrides = _split_dotted(overrides)
    valid = type(config).field_names()
    unknown = [k for k in overrides if k not in valid]
    if unknown:
        k = unknown[0]
        raise ConfigError(
            f"unknown config key {k!r} for {type(config).__name__}; "
            f"valid keys (closest first): {', '.join(closest(k, valid))}"
        )
    current = {f.name: getattr(config, f.name) for f in fields(config)}
    # Keep derived defaults derived: if the stored value equals what the defaults would derive
    # from the old dim/n_heads, let it be re-derived from the new ones.
    if "head_dim" not in overrides and ("dim" in overrides or "n_heads" in overrides):
        if current["head_dim"] == current["dim"] // current["n_heads"]:
            current["head_dim"] = None
    if "ffn_dim" not in overrides and "dim" in overrides:
        if current["ffn_dim"] == 4 * current["dim"]:
            current["ffn_dim"] = None
    if "attention" in overrides:
        overrides["attention"] = attention_config(overrides["attention"], config.attention)
    current.update(overrides)
    hints = typing.get_type_hints(type(config))
    for k, v in current.items():
        if isinstance(v, list) and _is_tuple_type(hints.get(k)):
            current[k] = tuple(tuple(x) if isinstance(x, list) else x for x in v)
    return type(config)(**current)


def _is_tuple_type(tp: Any) -> bool:
    if tp is None:
        return False
    origin = typing.get_origin(tp)
    if origin is tuple:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_tuple_type(a) for a in typing.get_args(tp))
    return False


def _convert(text: str, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if text.lower() in ("none", "null") and len(args) < len(typing.get_args(tp)):
            return None
        errors = []
        for a in args:
            try:
                return _convert(text, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"cannot parse {key}={text!r}: {'; '.join(errors)}")
    if tp is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} expects a boolean (true/false), got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{key} expects an integer, got {text!r}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{key} expects a number, got {text!r}") from None
    if tp is str:
        return text
    if origin is tuple:
        args = typing.get_args(tp)
        parts = [p for p in text.replace("x", ",").split(",") if p != ""] if text else []
        inner = args[0] if args else str
        return tuple(_convert(p.strip(), inner, key) for p in parts)
    if typing.get_origin(tp) is typing.Literal:
        if text not in typing.get_args(tp):
            raise ConfigError(f"{key} must be one of {list(typing.get_args(tp))}, got {text!r}")
        return text
    raise ConfigError(f"cannot parse a value for {key} of type {tp}")


def parse_overrides(
    config: type[ModelConfig] | ModelConfig, items: typing.Iterable[str]
) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` strings (from ``--set``) into typed overrides for ``config`` (a config
    class, or an instance, whose current attention types ``attention.FIELD`` values).

    ``attention.name=NAME`` (or ``attention=NAME``) picks another registered attention part (its
    defaults, then the other ``attention.*`` keys); ``attention.FIELD=VALUE`` sets one field of
    the current one. The attention keys come back as one ``"attention"`` config. Pass the
    instance being overridden (not its class) when its attention may differ from the family
    default.
    """
    config_cls = config if isinstance(config, type) else type(config)
    current = config.attention if not isinstance(config, type) else config_cls._default_attention()
    hints = typing.get_type_hints(config_cls)
    valid = config_cls.field_names()
    out: dict[str, Any] = {}
    nested: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if "attention" in valid and (key == "attention" or key.startswith("attention.")):
            nested[key.removeprefix("attention.") if key != "attention" else "name"] = value.strip()
            continue
        if key not in valid:
            raise ConfigError(
                f"unknown config key {key!r} for {config_cls.__name__}; "
                f"valid keys (closest first): {', '.join(closest(key, valid))}"
            )
        out[key] = _convert(value.strip(), hints[key], key)
    if nested:
        name = nested.pop("name", None)
        if current is None and name is None:
            raise ConfigError(f"{config_cls.__name__} has no attention part to set fields on")
        same = name is None or (current is not None and current.name == name)
        spec = {**({"name": name} if name else {}), **nested}
        out["attention"] = attention_config(spec, current if same else None)
    return out
