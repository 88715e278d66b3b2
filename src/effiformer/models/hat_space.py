"""HAT's design spaces and SubTransformers as data (Wang et al., ACL 2020, arXiv 2005.14187,
sec. 3.1-3.2; official ``configs/*/supertransformer/space{0,1}.yml``,
``configs/*/latency_dataset/*.yml``, ``configs/wmt14.en-de/subtransformer/HAT_*.yml``): what a
SubTransformer is (:class:`SubTransformer`: per-layer widths, heads and encoder-decoder
attention), the spaces it is drawn from (:class:`DesignSpace`, :data:`SPACES`,
:data:`LATENCY_SPACES`) and the released WMT'14 En-De SubTransformers
(:data:`RELEASED_WMT14_ENDE`). The model that runs them is :mod:`effiformer.models.hat`; the
search over them is :mod:`effiformer.search`. Kept apart from the model so that the space (what
the search and the latency datasets read) does not come with the network code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from ..config import ConfigError

__all__ = [
    "DesignSpace",
    "IWSLT_SPACE",
    "LATENCY_SPACES",
    "MULTI30K_SPACE",
    "RELEASED_WMT14_ENDE",
    "SPACES",
    "SubTransformer",
    "TINY_SPACE",
    "WMT_SPACE",
    "get_space",
    "latency_space",
    "sample_generator",
]
# ------------------------------------------------------------------------------------------------
# SubTransformers and design spaces (data)
# ------------------------------------------------------------------------------------------------

_PER_ENCODER_LAYER = ("encoder_ffn", "encoder_heads")
_PER_DECODER_LAYER = ("decoder_ffn", "decoder_heads", "cross_heads", "attend")


def _ints(name: str, value: Any, *, allow_empty: bool = False) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    try:
        out = tuple(value)
    except TypeError:
        raise ConfigError(f"{name} must be a sequence of positive ints, got {value!r}") from None
    if not out and not allow_empty:
        raise ConfigError(f"{name} must not be empty")
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(f"{name} must hold positive ints, got {value!r}")
    return out


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class SubTransformer:
    """One architecture of a design space (the official ``config`` dict of ``sample_configs``).

    ``encoder_dim`` / ``decoder_dim``: embedding widths; ``encoder_layers`` / ``decoder_layers``:
    depths; per encoder layer ``encoder_ffn`` (FFN width) and ``encoder_heads``; per decoder
    layer ``decoder_ffn``, ``decoder_heads`` (self-attention), ``cross_heads`` (encoder-decoder
    attention) and ``attend`` (how many of the last encoder layers it attends to: 1, 2 or 3).
    Per-layer tuples may be longer than the depth (a gene covers every layer slot of the
    SuperTransformer, as the official ``Converter``); entries past the depth are inactive and
    ignored everywhere (:meth:`trimmed` drops them; equality of architectures is
    ``a.trimmed() == b.trimmed()``).
    """

    encoder_dim: int
    decoder_dim: int
    encoder_layers: int
    decoder_layers: int
    encoder_ffn: tuple[int, ...]
    encoder_heads: tuple[int, ...]
    decoder_ffn: tuple[int, ...]
    decoder_heads: tuple[int, ...]
    cross_heads: tuple[int, ...]
    attend: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("encoder_dim", "decoder_dim", "encoder_layers", "decoder_layers"):
            _positive(name, getattr(self, name))
        for names, depth in (
            (_PER_ENCODER_LAYER, self.encoder_layers),
            (_PER_DECODER_LAYER, self.decoder_layers),
        ):
            for name in names:
                value = _ints(name, getattr(self, name))
                object.__setattr__(self, name, value)
                if len(value) < depth:
                    raise ConfigError(
                        f"{name} has {len(value)} entries for {depth} layers; give one per layer"
                    )
        for i, m in enumerate(self.attend[: self.decoder_layers]):
            if m > self.encoder_layers:
                raise ConfigError(
                    f"attend[{i}]={m}: decoder layer {i} cannot attend to more encoder layers "
                    f"than the encoder has ({self.encoder_layers})"
                )

    def trimmed(self) -> SubTransformer:
        """The same architecture with the per-layer tuples cut to the active layers."""
        cut = {n: getattr(self, n)[: self.encoder_layers] for n in _PER_ENCODER_LAYER}
        cut.update({n: getattr(self, n)[: self.decoder_layers] for n in _PER_DECODER_LAYER})
        return dataclasses.replace(self, **cut)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (lists for the per-layer tuples), the active layers only."""
        t = self.trimmed()
        out: dict[str, Any] = {}
        for f in fields(t):
            v = getattr(t, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SubTransformer:
        names = [f.name for f in fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            raise ConfigError(f"unknown SubTransformer field {unknown[0]!r}; fields: {names}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    @classmethod
    def from_hat(cls, config: Mapping[str, Any]) -> SubTransformer:
        """From the official formats: a SubTransformer ``.yml``'s keys
        (``encoder-embed-dim-subtransformer``, ...) or the nested ``{"encoder": {...},
        "decoder": {...}}`` dict of ``utils.sample_configs``; the arbitrary-attention code
        -1 / 1 / 2 becomes 1 / 2 / 3 layers."""
        if "encoder" in config and "decoder" in config:
            e, d = config["encoder"], config["decoder"]
            get = {
                "encoder_dim": e["encoder_embed_dim"],
                "encoder_layers": e["encoder_layer_num"],
                "encoder_ffn": e["encoder_ffn_embed_dim"],
                "encoder_heads": e["encoder_self_attention_heads"],
                "decoder_dim": d["decoder_embed_dim"],
                "decoder_layers": d["decoder_layer_num"],
                "decoder_ffn": d["decoder_ffn_embed_dim"],
                "decoder_heads": d["decoder_self_attention_heads"],
                "cross_heads": d["decoder_ende_attention_heads"],
                "attend": d["decoder_arbitrary_ende_attn"],
            }
        else:
            k = "-subtransformer"
            get = {
                "encoder_dim": config["encoder-embed-dim" + k],
                "encoder_layers": config["encoder-layer-num" + k],
                "encoder_ffn": config["encoder-ffn-embed-dim-all" + k],
                "encoder_heads": config["encoder-self-attention-heads-all" + k],
                "decoder_dim": config["decoder-embed-dim" + k],
                "decoder_layers": config["decoder-layer-num" + k],
                "decoder_ffn": config["decoder-ffn-embed-dim-all" + k],
                "decoder_heads": config["decoder-self-attention-heads-all" + k],
                "cross_heads": config["decoder-ende-attention-heads-all" + k],
                "attend": config["decoder-arbitrary-ende-attn-all" + k],
            }
        codes = {-1: 1, 1: 2, 2: 3}
        try:
            get["attend"] = tuple(codes[int(a)] for a in get["attend"])
        except KeyError as e:
            raise ConfigError(
                f"arbitrary attention codes are -1, 1 or 2, got {e.args[0]}"
            ) from None
        return cls(**get)

    def to_hat(self) -> dict[str, Any]:
        """The official SubTransformer ``.yml`` keys (arbitrary attention as -1 / 1 / 2)."""
        t = self.trimmed()
        k = "-subtransformer"
        return {
            "encoder-embed-dim" + k: t.encoder_dim,
            "decoder-embed-dim" + k: t.decoder_dim,
            "encoder-ffn-embed-dim-all" + k: list(t.encoder_ffn),
            "decoder-ffn-embed-dim-all" + k: list(t.decoder_ffn),
            "encoder-layer-num" + k: t.encoder_layers,
            "decoder-layer-num" + k: t.decoder_layers,
            "encoder-self-attention-heads-all" + k: list(t.encoder_heads),
            "decoder-self-attention-heads-all" + k: list(t.decoder_heads),
            "decoder-ende-attention-heads-all" + k: list(t.cross_heads),
            "decoder-arbitrary-ende-attn-all" + k: [{1: -1, 2: 1, 3: 2}[m] for m in t.attend],
        }

    def describe(self) -> str:
        """One line: ``enc 512x6 ffn[...] h[...] | dec 512x2 ffn[...] h[...] x[...] att[...]``."""
        t = self.trimmed()

        def j(v: tuple[int, ...]) -> str:
            return ",".join(map(str, v))

        return (
            f"enc {t.encoder_dim}x{t.encoder_layers} ffn[{j(t.encoder_ffn)}] "
            f"h[{j(t.encoder_heads)}] | dec {t.decoder_dim}x{t.decoder_layers} "
            f"ffn[{j(t.decoder_ffn)}] h[{j(t.decoder_heads)}] x[{j(t.cross_heads)}] "
            f"att[{j(t.attend)}]"
        )


@dataclass(frozen=True, kw_only=True)
class DesignSpace:
    """The choices of a SuperTransformer's SubTransformers (``*-choice`` of the official
    ``space*.yml``). Per-layer choices (FFN width, heads, ``attend``) are made independently for
    every layer. ``qkv_dim``: the fixed Q/K/V width (every head count must divide it). The
    SuperTransformer has the largest of every choice."""

    encoder_dim: tuple[int, ...]
    decoder_dim: tuple[int, ...]
    encoder_layers: tuple[int, ...]
    decoder_layers: tuple[int, ...]
    encoder_ffn: tuple[int, ...]
    decoder_ffn: tuple[int, ...]
    encoder_heads: tuple[int, ...]
    decoder_heads: tuple[int, ...]
    cross_heads: tuple[int, ...]
    attend: tuple[int, ...] = (1, 2, 3)
    qkv_dim: int = 512

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "qkv_dim":
                object.__setattr__(self, f.name, _ints(f"space.{f.name}", getattr(self, f.name)))
        _positive("space.qkv_dim", self.qkv_dim)
        for name in ("encoder_heads", "decoder_heads", "cross_heads"):
            for h in getattr(self, name):
                if self.qkv_dim % h:
                    raise ConfigError(
                        f"space.{name}: {h} heads do not divide qkv_dim={self.qkv_dim}"
                    )
        if max(self.attend) > min(self.encoder_layers):
            raise ConfigError(
                f"space.attend reaches {max(self.attend)} encoder layers but the encoder may "
                f"have only {min(self.encoder_layers)}"
            )

    # ---- the SuperTransformer's widths -------------------------------------------------------

    @property
    def max_encoder_dim(self) -> int:
        return max(self.encoder_dim)

    @property
    def max_decoder_dim(self) -> int:
        return max(self.decoder_dim)

    @property
    def max_encoder_layers(self) -> int:
        return max(self.encoder_layers)

    @property
    def max_decoder_layers(self) -> int:
        return max(self.decoder_layers)

    def largest(self, *, attend: int | None = None) -> SubTransformer:
        """Every choice at its largest (``attend``: the layers each decoder layer attends to;
        default the largest)."""
        return self._uniform(max, attend)

    def smallest(self, *, attend: int | None = None) -> SubTransformer:
        """Every choice at its smallest (``attend`` default: the smallest)."""
        return self._uniform(min, attend)

    def _uniform(self, pick, attend: int | None) -> SubTransformer:
        ne, nd = pick(self.encoder_layers), pick(self.decoder_layers)
        a = pick(self.attend) if attend is None else attend
        return SubTransformer(
            encoder_dim=pick(self.encoder_dim),
            decoder_dim=pick(self.decoder_dim),
            encoder_layers=ne,
            decoder_layers=nd,
            encoder_ffn=(pick(self.encoder_ffn),) * ne,
            encoder_heads=(pick(self.encoder_heads),) * ne,
            decoder_ffn=(pick(self.decoder_ffn),) * nd,
            decoder_heads=(pick(self.decoder_heads),) * nd,
            cross_heads=(pick(self.cross_heads),) * nd,
            attend=(a,) * nd,
        )

    # ---- sampling and membership -------------------------------------------------------------

    def gene_choices(self) -> list[tuple[str, int | None, tuple[int, ...]]]:
        """The genes of a SubTransformer: ``(field, layer or None, choices)`` for the widths and
        depths and for every layer slot of the SuperTransformer (the official ``Converter``
        order: encoder then decoder)."""
        out: list[tuple[str, int | None, tuple[int, ...]]] = [
            ("encoder_dim", None, self.encoder_dim),
            ("encoder_layers", None, self.encoder_layers),
        ]
        for name in _PER_ENCODER_LAYER:
            out += [(name, i, getattr(self, name)) for i in range(self.max_encoder_layers)]
        out += [
            ("decoder_dim", None, self.decoder_dim),
            ("decoder_layers", None, self.decoder_layers),
        ]
        for name in _PER_DECODER_LAYER:
            out += [(name, i, getattr(self, name)) for i in range(self.max_decoder_layers)]
        return out

    def from_gene(self, gene: Sequence[int]) -> SubTransformer:
        """The SubTransformer a gene (one value per :meth:`gene_choices` entry) describes."""
        choices = self.gene_choices()
        if len(gene) != len(choices):
            raise ValueError(f"a gene of this space has {len(choices)} values, got {len(gene)}")
        scalars: dict[str, int] = {}
        lists: dict[str, list[int]] = {n: [] for n in (*_PER_ENCODER_LAYER, *_PER_DECODER_LAYER)}
        for (name, layer, _), v in zip(choices, gene):
            if layer is None:
                scalars[name] = int(v)
            else:
                lists[name].append(int(v))
        return SubTransformer(**scalars, **{k: tuple(v) for k, v in lists.items()})

    def to_gene(self, sub: SubTransformer) -> list[int]:
        """The gene of ``sub``; inactive slots are filled with the first layer's value (as the
        official ``config2gene``)."""
        gene = []
        for name, layer, _ in self.gene_choices():
            if layer is None:
                gene.append(getattr(sub, name))
            else:
                values = getattr(sub, name)
                depth = sub.encoder_layers if name in _PER_ENCODER_LAYER else sub.decoder_layers
                gene.append(values[layer] if layer < min(depth, len(values)) else values[0])
        return gene

    def sample(self, generator: torch.Generator | None = None) -> SubTransformer:
        """A SubTransformer with every gene drawn uniformly and independently (every layer slot
        of the SuperTransformer is drawn, used or not, so a sample always costs the same draws)."""
        gene = []
        for _, _, choices in self.gene_choices():
            i = int(torch.randint(len(choices), (), generator=generator))
            gene.append(choices[i])
        return self.from_gene(gene)

    def contains(self, sub: SubTransformer) -> bool:
        """Whether every active choice of ``sub`` is one of this space's."""
        return not self.violations(sub)

    def violations(self, sub: SubTransformer) -> list[str]:
        """What in ``sub`` this space does not offer (empty: it is a member)."""
        bad = []
        t = sub.trimmed()
        for name in ("encoder_dim", "decoder_dim", "encoder_layers", "decoder_layers"):
            if getattr(t, name) not in getattr(self, name):
                bad.append(f"{name}={getattr(t, name)} not in {list(getattr(self, name))}")
        for name in (*_PER_ENCODER_LAYER, *_PER_DECODER_LAYER):
            allowed = getattr(self, name)
            for i, v in enumerate(getattr(t, name)):
                if v not in allowed:
                    bad.append(f"{name}[{i}]={v} not in {list(allowed)}")
        return bad

    def size(self) -> int:
        """How many distinct SubTransformers the space holds (inactive slots do not count)."""
        enc = sum(
            (len(self.encoder_ffn) * len(self.encoder_heads)) ** n for n in self.encoder_layers
        )
        per_dec = len(self.decoder_ffn) * len(self.decoder_heads) * len(self.cross_heads)
        dec = 0
        for n in self.decoder_layers:
            reach = [a for a in self.attend if a <= min(self.encoder_layers)]
            dec += (per_dec * len(reach)) ** n
        return len(self.encoder_dim) * len(self.decoder_dim) * enc * dec

    def widened(self, *, ffn: Iterable[int] = (), heads: Iterable[int] = ()) -> DesignSpace:
        """This space with extra FFN widths and head counts (the latency datasets' wider
        spaces: HAT adds FFN 512 and 2 heads to the WMT space)."""
        ffn, heads = tuple(ffn), tuple(heads)

        def add(old: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(sorted(set(old) | set(new), reverse=True))

        return dataclasses.replace(
            self,
            encoder_ffn=add(self.encoder_ffn, ffn),
            decoder_ffn=add(self.decoder_ffn, ffn),
            encoder_heads=add(self.encoder_heads, heads),
            decoder_heads=add(self.decoder_heads, heads),
            cross_heads=add(self.cross_heads, heads),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DesignSpace:
        names = [f.name for f in fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            raise ConfigError(f"unknown design-space field {unknown[0]!r}; fields: {names}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


#: WMT'14 En-De / En-Fr, WMT'19 En-De (``configs/wmt14.en-de/supertransformer/space0.yml``):
#: about 0.4e15 SubTransformers (official issue #10).
WMT_SPACE = DesignSpace(
    encoder_dim=(640, 512),
    decoder_dim=(640, 512),
    encoder_layers=(6,),
    decoder_layers=(6, 5, 4, 3, 2, 1),
    encoder_ffn=(3072, 2048, 1024),
    decoder_ffn=(3072, 2048, 1024),
    encoder_heads=(8, 4),
    decoder_heads=(8, 4),
    cross_heads=(8, 4),
    attend=(1, 2, 3),
    qkv_dim=512,
)
#: IWSLT'14 De-En (``configs/iwslt14.de-en/supertransformer/space1.yml``).
IWSLT_SPACE = dataclasses.replace(
    WMT_SPACE,
    encoder_ffn=(2048, 1024, 512),
    decoder_ffn=(2048, 1024, 512),
    encoder_heads=(4, 2),
    decoder_heads=(4, 2),
    cross_heads=(4, 2),
)
#: Multi30k on a CPU: the WMT space at half the widths (embeddings {320, 256}, qkv 256, FFN
#: {1024, 768, 512}, heads {4, 2}) and two thirds of the depth (encoder 4, decoder 1-4).
#: Its SuperTransformer (4+4 layers, d 320) costs about what ``transformer-multi30k`` (3+3, d 256)
#: does per step.
MULTI30K_SPACE = DesignSpace(
    encoder_dim=(320, 256),
    decoder_dim=(320, 256),
    encoder_layers=(4,),
    decoder_layers=(4, 3, 2, 1),
    encoder_ffn=(1024, 768, 512),
    decoder_ffn=(1024, 768, 512),
    encoder_heads=(4, 2),
    decoder_heads=(4, 2),
    cross_heads=(4, 2),
    attend=(1, 2, 3),
    qkv_dim=256,
)
#: For tests: two encoder layers, one or two decoder layers, d {32, 24}, qkv 16.
TINY_SPACE = DesignSpace(
    encoder_dim=(32, 24),
    decoder_dim=(32, 24),
    encoder_layers=(2,),
    decoder_layers=(2, 1),
    encoder_ffn=(64, 32),
    decoder_ffn=(64, 32),
    encoder_heads=(4, 2),
    decoder_heads=(4, 2),
    cross_heads=(4, 2),
    attend=(1, 2),
    qkv_dim=16,
)
SPACES: dict[str, DesignSpace] = {
    "wmt": WMT_SPACE,
    "iwslt": IWSLT_SPACE,
    "multi30k": MULTI30K_SPACE,
    "tiny": TINY_SPACE,
}
#: The spaces latency datasets are sampled from: wider than training (the official
#: ``configs/*/latency_dataset/*.yml``). WMT: FFN adds 512, heads add 2; IWSLT: the official file
#: uses the WMT latency space (FFN up to 3072, 8 heads), kept here; Multi30k and tiny: the same
#: rule at their scale (half the smallest FFN width, half the smallest head count).
LATENCY_SPACES: dict[str, DesignSpace] = {
    "wmt": WMT_SPACE.widened(ffn=(512,), heads=(2,)),
    "iwslt": WMT_SPACE.widened(ffn=(512,), heads=(2,)),
    "multi30k": MULTI30K_SPACE.widened(ffn=(256,), heads=(1,)),
    "tiny": TINY_SPACE.widened(ffn=(16,), heads=(1,)),
}


def sample_generator(seed: int, index: int) -> torch.Generator:
    """The generator draw ``index`` (a training step, a latency-dataset row) of a run seeded
    ``seed`` uses: seeded by ``(seed, index)`` alone, so a draw never depends on the draws
    before it and a resumed run draws what the uninterrupted one would have. (The official
    code reseeds Python's global ``random`` with the update number instead.)"""
    mixed = np.random.SeedSequence([int(seed) % 2**63, int(index)]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(mixed))


def get_space(space: DesignSpace | str | Mapping[str, Any]) -> DesignSpace:
    """A :class:`DesignSpace` from itself, a name of :data:`SPACES` or its dict."""
    if isinstance(space, DesignSpace):
        return space
    if isinstance(space, str):
        if space not in SPACES:
            raise ConfigError(f"unknown design space {space!r}; named spaces: {sorted(SPACES)}")
        return SPACES[space]
    if isinstance(space, Mapping):
        return DesignSpace.from_dict(space)
    raise ConfigError(f"space must be a DesignSpace, a name or a dict, got {type(space).__name__}")


def latency_space(space: DesignSpace | str) -> DesignSpace:
    """The wider space to sample a latency dataset from: :data:`LATENCY_SPACES` for a named
    space; otherwise FFN widths and head counts extended by half their smallest value."""
    if isinstance(space, str):
        if space not in LATENCY_SPACES:
            raise ConfigError(f"no latency space for {space!r}; named: {sorted(LATENCY_SPACES)}")
        return LATENCY_SPACES[space]
    for name, s in SPACES.items():
        if s == space:
            return LATENCY_SPACES[name]
    ffn = min(min(space.encoder_ffn), min(space.decoder_ffn)) // 2
    heads = min(min(space.encoder_heads), min(space.decoder_heads), min(space.cross_heads)) // 2
    return space.widened(ffn=(ffn,) if ffn else (), heads=(heads,) if heads else ())


def _released() -> dict[str, dict[str, Any]]:
    """The WMT'14 En-De SubTransformers of ``configs/wmt14.en-de/subtransformer/HAT_*.yml``
    and the README's figures for each (measured latency, #params and FLOPs without embeddings
    and output layer, BLEU, SacreBLEU)."""

    def sub(ffn_e, heads_e, ffn_d, heads_d, cross, att, dim=512) -> SubTransformer:
        return SubTransformer.from_hat(
            {
                "encoder": {
                    "encoder_embed_dim": dim,
                    "encoder_layer_num": 6,
                    "encoder_ffn_embed_dim": ffn_e,
                    "encoder_self_attention_heads": heads_e,
                },
                "decoder": {
                    "decoder_embed_dim": dim,
                    "decoder_layer_num": len(ffn_d),
                    "decoder_ffn_embed_dim": ffn_d,
                    "decoder_self_attention_heads": heads_d,
                    "decoder_ende_attention_heads": cross,
                    "decoder_arbitrary_ende_attn": att,
                },
            }
        )

    f3 = [3072] * 6
    rows = [
        # name, device, latency (ms), params (M), GFLOPs, BLEU, SacreBLEU, architecture
        ("raspberrypi@3.5s", "raspberrypi", 3500.0, 25.22, 1.53, 25.8, 25.6,
         sub([1024, 3072, 3072, 2048, 2048, 2048], [4, 8, 4, 4, 4, 8], [3072], [8], [8], [-1])),
        ("raspberrypi@4.0s", "raspberrypi", 4000.0, 29.42, 1.78, 26.9, 26.6,
         sub([3072, 2048, 3072, 2048, 3072, 2048], [8, 8, 8, 4, 8, 8], [1024, 2048], [4, 4],
             [8, 8], [-1, -1])),
        ("raspberrypi@4.5s", "raspberrypi", 4500.0, 35.72, 2.19, 27.6, 27.1,
         sub(f3, [4, 8, 8, 4, 8, 8], [3072, 3072], [8, 8], [8, 8], [-1, 1])),
        ("raspberrypi@5.0s", "raspberrypi", 5000.0, 36.77, 2.26, 27.8, 27.2,
         sub([3072, 3072, 3072, 2048, 3072, 3072], [8, 8, 8, 8, 8, 4], [1024, 2048, 3072],
             [4, 8, 8], [4, 8, 8], [-1, 1, -1])),
        ("raspberrypi@6.0s", "raspberrypi", 6000.0, 44.13, 2.70, 28.2, 27.6,
         sub(f3, [4, 4, 4, 8, 8, 4], [2048, 2048, 3072, 3072], [4, 8, 8, 4], [4, 8, 8, 8],
             [-1, -1, 1, -1])),
        ("raspberrypi@6.9s", "raspberrypi", 6900.0, 48.33, 3.02, 28.4, 27.8,
         sub(f3, [8, 4, 8, 8, 8, 8], [2048, 2048, 3072, 3072, 2048], [8, 8, 8, 4, 8],
             [4, 8, 8, 8, 8], [-1, 1, 1, 1, -1])),
        ("xeon@137.9ms", "xeon", 137.9, 30.47, 1.87, 25.8, 25.6,
         sub(f3, [4, 8, 8, 8, 8, 8], [3072], [8], [8], [1])),
        ("xeon@204.2ms", "xeon", 204.2, 35.72, 2.19, 27.6, 27.1,
         sub(f3, [4, 8, 8, 4, 8, 8], [3072, 3072], [8, 8], [8, 8], [-1, 1])),
        ("xeon@278.7ms", "xeon", 278.7, 40.97, 2.54, 27.9, 27.3,
         sub(f3, [4, 4, 8, 8, 8, 4], [3072] * 3, [8, 8, 8], [4, 8, 8], [-1, 1, 1])),
        ("xeon@340.2ms", "xeon", 340.2, 46.23, 2.86, 28.1, 27.5,
         sub(f3, [4, 4, 8, 8, 8, 4], [3072] * 4, [8, 8, 8, 4], [4, 8, 8, 8], [-1, 1, 1, -1])),
        ("xeon@369.6ms", "xeon", 369.6, 51.48, 3.21, 28.2, 27.6,
         sub(f3, [8, 4, 8, 8, 8, 4], [3072] * 5, [8, 8, 8, 4, 8], [4, 8, 8, 8, 8],
             [-1, 1, 1, 1, -1])),
        ("xeon@450.9ms", "xeon", 450.9, 56.73, 3.53, 28.5, 27.9,
         sub(f3, [4, 4, 8, 8, 8, 4], [3072] * 6, [8, 8, 8, 4, 4, 4], [4, 8, 8, 8, 8, 8],
             [-1, 1, 1, 1, -1, -1])),
        ("titanxp@57.1ms", "titanxp", 57.1, 30.47, 1.87, 25.8, 25.6,
         sub(f3, [4, 8, 8, 8, 8, 8], [3072], [8], [8], [1])),
        ("titanxp@91.2ms", "titanxp", 91.2, 35.72, 2.19, 27.6, 27.1,
         sub(f3, [4, 8, 8, 4, 8, 8], [3072, 3072], [8, 8], [8, 8], [-1, 1])),
        ("titanxp@126.0ms", "titanxp", 126.0, 40.97, 2.54, 27.9, 27.3,
         sub(f3, [4, 4, 8, 8, 8, 4], [3072] * 3, [8, 8, 8], [4, 8, 8], [-1, 1, 1])),
        ("titanxp@146.7ms", "titanxp", 146.7, 51.20, 3.17, 28.1, 27.5,
         sub(f3, [4, 8, 8, 8, 4, 4], [3072] * 3, [8, 8, 8], [4, 8, 8], [-1, 1, 1], dim=640)),
        ("titanxp@208.1ms", "titanxp", 208.1, 49.38, 3.09, 28.5, 27.8,
         sub(f3, [8, 4, 8, 8, 8, 4], [2048, 2048, 3072, 3072, 3072], [8, 8, 8, 4, 8],
             [4, 8, 8, 8, 8], [-1, 1, 1, 1, -1])),
    ]  # fmt: skip
    keys = ("device", "latency_ms", "params_m", "gflops", "bleu", "sacrebleu", "sub")
    return {f"HAT_wmt14ende_{r[0]}": dict(zip(keys, r[1:])) for r in rows}


#: The released WMT'14 En-De SubTransformers by their official model names
#: (``HAT_wmt14ende_xeon@137.9ms`` ...): ``{"device", "latency_ms", "params_m", "gflops",
#: "bleu", "sacrebleu", "sub"}``, the figures from the official README's table ("#Params and
#: FLOPs do not count in the embedding lookup table and the last output layers").
RELEASED_WMT14_ENDE: dict[str, dict[str, Any]] = _released()
