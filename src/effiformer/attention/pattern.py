"""Layer patterns: a different attention part per layer, repeating (the Reformer's enwik8 recipe).

Kitaev, Kaiser, Levskaya 2020 (arXiv 2001.04451), sec. 5, and the official trax config
``trax/supervised/configs/reformer_enwik8.gin``: ``attn_type = [SelfAttention, SelfAttention,
LSHSelfAttention, SelfAttention]`` -- two chunked local layers, an LSH layer, a local layer,
repeated over the 12 layers (trax's ``ReformerLM`` takes ``attention_type[layer % len]``).

:class:`PatternConfig` holds a tuple of attention configs; ``for_layer(layer, n_layers)`` returns
``layers[layer % len(layers)]``, so every family that builds its attention with
:func:`~effiformer.attention.registry.build_attention` takes a pattern by configuration::

    create_model("vanilla-small", attention={"name": "pattern", "layers": [
        {"name": "local", "window": 128}, {"name": "local", "window": 128},
        {"name": "lsh", "chunk_len": 256, "n_hashes": 2}, {"name": "local", "window": 128}]})

On the command line, ``--set attention.name=pattern attention.layers=local,local,lsh,local``
gives each part its registered defaults. The pattern itself builds no module: its "module class"
(:class:`PatternAttention`) delegates to the layer's own part, so a pattern layer *is* a local or
LSH layer (checkpoint keys ``blocks.2.attn.qk_proj...``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config import AttentionConfig, ConfigError, attention_config
from .base import AttentionDims, AttentionPart
from .registry import get_attention, register_attention

__all__ = ["PatternConfig", "PatternAttention"]


@dataclass(frozen=True, kw_only=True)
class PatternConfig(AttentionConfig):
    """``layers``: the attention of layers 0, 1, 2, ... (repeating): configs, registered names
    or dicts of their fields (turned into configs here). Default: the Reformer enwik8 pattern
    with registered defaults ``local, local, lsh, local``."""

    name = "pattern"

    layers: tuple[AttentionConfig | str, ...] = ("local", "local", "lsh", "local")

    def __post_init__(self) -> None:
        layers = self.layers
        if isinstance(layers, (str, AttentionConfig, dict)):
            layers = (layers,)
        if not isinstance(layers, (tuple, list)) or not layers:
            raise ConfigError(
                f"attention.layers must be a non-empty tuple of attention configs, got {layers!r}"
            )
        built = []
        for i, c in enumerate(layers):
            try:
                cfg = attention_config(c)
            except ConfigError as e:
                raise ConfigError(f"attention.layers[{i}]: {e}") from None
            if isinstance(cfg, PatternConfig):
                raise ConfigError(f"attention.layers[{i}]: a pattern cannot nest another pattern")
            built.append(cfg)
        object.__setattr__(self, "layers", tuple(built))

    def for_layer(self, layer: int, n_layers: int) -> AttentionConfig:
        return self.layers[layer % len(self.layers)]  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layers": [c.to_dict() for c in self.layers]}  # type: ignore[union-attr]


def _part(config: AttentionConfig) -> type[AttentionPart]:
    return get_attention(config.name).module_cls


class PatternAttention(AttentionPart):
    """Not instantiated: :meth:`from_config` builds the layer's own part. The testing hooks map
    each layer's config through its part's hooks."""

    @classmethod
    def from_config(cls, config: PatternConfig, dims: AttentionDims) -> AttentionPart:
        sub = config.for_layer(dims.layer, dims.n_layers)
        return _part(sub).from_config(sub, dims)

    @classmethod
    def build_shared(cls, config: PatternConfig, dims: AttentionDims) -> nn.Module | None:
        sub = config.for_layer(dims.layer, dims.n_layers)
        return _part(sub).build_shared(sub, dims)

    @classmethod
    def _map(cls, config: PatternConfig, seq_len: int, hook: str) -> PatternConfig | None:
        out = []
        for c in config.layers:
            mapped = getattr(_part(c), hook)(c, seq_len)  # type: ignore[arg-type]
            if mapped is None:
                return None
            out.append(mapped)
        return dataclasses.replace(config, layers=tuple(out))

    @classmethod
    def example_config(cls, config: PatternConfig, seq_len: int) -> PatternConfig:
        return cls._map(config, seq_len, "example_config")  # type: ignore[return-value]

    @classmethod
    def degenerate_config(cls, config: PatternConfig, seq_len: int) -> PatternConfig:
        return cls._map(config, seq_len, "degenerate_config")  # type: ignore[return-value]

    @classmethod
    def causal_config(cls, config: PatternConfig, seq_len: int) -> PatternConfig | None:
        return cls._map(config, seq_len, "causal_config")


register_attention(
    "pattern",
    PatternConfig,
    PatternAttention,
    description="a repeating per-layer pattern of attention parts (Reformer enwik8: local, "
    "local, lsh, local)",
)
