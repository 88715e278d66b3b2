"""Training recipes: each family's paper recipe, by family name.

A :class:`TrainRecipe` is how a paper trained its model: the optimiser, its learning rate, betas,
epsilon and weight decay (and which parameters are excluded from decay), the warmup, the schedule
shape and its floor, and gradient clipping. The recipes are defined below, each with its source;
a family registers its recipe once, at the bottom of its model file, right after its
``register_family`` line::

    register_recipe("xl", XL_RECIPE)

A paper whose models live in another family's code but were trained otherwise (Lite Transformer
in the ``seq2seq`` family) registers its recipes for model-name globs, which
:func:`recipe_for` looks up before the family's::

    register_model_recipe("lite-wmt-*", LITE_WMT_RECIPE)

``effiformer train`` takes :func:`recipe_for` the model (its name's recipe, else its family's)
unless flags override fields (:func:`apply_recipe` records which); :func:`effiformer.train.train` itself only reads a
:class:`~effiformer.train.TrainConfig`, whose fields of the same names the recipe fills.

Paper warmups are sized for runs of 10^5-10^6 steps. :func:`apply_recipe` caps a warmup longer
than 10% of the run at 10% of the run (at least one step) and says so; it changes nothing else.

This module is low: it imports nothing of effiformer but :mod:`effiformer.config`. Families
register their recipes when :mod:`effiformer.models` is imported (``create_model`` and the CLI do).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .config import ConfigError

__all__ = [
    "ADAPTIVE_SPAN_RECIPE",
    "ADAPTIVE_SPAN_LARGE_RECIPE",
    "ADAPTIVE_SPAN_SMALL_RECIPE",
    "ROUTING_RECIPE",
    "DEFAULT_DECODING",
    "FAIRSEQ_IWSLT_DECODING",
    "HAT_IWSLT_DECODING",
    "HAT_WMT_DECODING",
    "LITE_IWSLT_DECODING",
    "LITE_WMT_DECODING",
    "VASWANI_DECODING",
    "DecodingRecipe",
    "LENPEN_FORMS",
    "decoding_for",
    "register_model_decoding",
    "ROUTING_WT103_RECIPE",
    "COMPRESSIVE_RECIPE",
    "FUNNEL_RECIPE",
    "LITE_IWSLT_RECIPE",
    "LITE_WMT_EN_FR_RECIPE",
    "LITE_WMT_RECIPE",
    "REFORMER_RECIPE",
    "VANILLA_RECIPE",
    "SEQ2SEQ_RECIPE",
    "XL_RECIPE",
    "NO_DECAY_RULES",
    "OPTIMIZERS",
    "RECIPE_FIELDS",
    "SCHEDULES",
    "RecipeChoice",
    "TrainRecipe",
    "apply_recipe",
    "describe_training",
    "get_recipe",
    "list_model_recipes",
    "list_recipes",
    "recipe_for",
    "register_model_recipe",
    "register_recipe",
]

#: Optimisers :func:`effiformer.train.train` builds: ``adamw`` (decoupled weight decay,
#: Loshchilov & Hutter 2019), ``adam`` (torch's Adam; weight decay is an L2 term), ``adagrad``,
#: ``adagrad-clip`` (Adaptive Span's Adagrad whose ``clip`` shrinks each parameter tensor's step
#: by its own gradient norm instead of clipping the global norm: :mod:`effiformer.optim`).
OPTIMIZERS = ("adamw", "adam", "adagrad", "adagrad-clip", "adafactor")
#: Schedules after the linear warmup: ``cosine`` to ``min_lr_ratio``, ``linear`` to
#: ``min_lr_ratio``, ``constant``, ``inverse_sqrt`` (fairseq's: ``sqrt(warmup / step)``).
SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt")
#: Which parameters weight decay applies to.
NO_DECAY_RULES: dict[str, str] = {
    "1d": "no decay on parameters with fewer than 2 dims (biases, norm weights, other vectors)",
    "bias-norm": "no decay on biases and normalisation weights (BERT's exclusion)",
    "bias-norm-embedding": "no decay on biases, normalisation weights and embeddings",
}
#: The :class:`~effiformer.train.TrainConfig` fields a recipe sets.
RECIPE_FIELDS = (
    "optimizer",
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "no_decay",
    "warmup",
    "schedule",
    "min_lr_ratio",
    "clip",
)


@dataclass(frozen=True, kw_only=True)
class TrainRecipe:
    """A paper's training recipe. ``name``: what the recipe line calls it (the family);
    ``source``: the paper and script it comes from; ``steps``: the run length the schedule was
    made for (informative; ``None``: not tied to one); ``notes``: deliberate deviations.
    The other fields mean what the :class:`~effiformer.train.TrainConfig` fields of the same
    names mean (``clip=None``: no clipping)."""

    name: str
    source: str
    optimizer: str = "adamw"
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay: str = "1d"
    warmup: int = 0
    schedule: str = "cosine"
    min_lr_ratio: float = 0.0
    clip: float | None = None
    steps: int | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.no_decay not in NO_DECAY_RULES:
            raise ConfigError(
                f"no_decay must be one of {list(NO_DECAY_RULES)}, got {self.no_decay!r}"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a positive number, got {self.lr!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"warmup must be an integer >= 0, got {self.warmup!r}")

    def values(self) -> dict[str, Any]:
        """The :data:`RECIPE_FIELDS` of this recipe, as ``TrainConfig`` keyword arguments."""
        return {k: getattr(self, k) for k in RECIPE_FIELDS}


# ------------------------------------------------------------------------------------------------
# The papers' recipes (registered by the model files)
# ------------------------------------------------------------------------------------------------

#: The dense baseline: the project's GPT-2-style default (what ``TrainConfig()`` defaults to).
VANILLA_RECIPE = TrainRecipe(
    name="vanilla",
    source="project default, GPT-2 style",
    optimizer="adamw",
    lr=1e-3,
    betas=(0.9, 0.99),
    eps=1e-8,
    weight_decay=0.1,
    no_decay="1d",
    warmup=100,
    schedule="cosine",
    min_lr_ratio=0.1,
    clip=1.0,
)

#: Transformer-XL (Dai et al. 2019, arXiv 1901.02860): ``pytorch/run_enwik8_base.sh``
#: (``--optim adam --lr 0.00025 --warmup_step 0 --max_step 400000``) with ``pytorch/train.py``'s
#: defaults for what the script does not set (``--scheduler cosine``, ``--eta_min 0.0``,
#: ``--clip 0.25``; Adam's own betas and eps; no weight decay).
XL_RECIPE = TrainRecipe(
    name="xl",
    source="Dai et al. 2019, run_enwik8_base.sh",
    optimizer="adam",
    lr=2.5e-4,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    warmup=0,
    schedule="cosine",
    min_lr_ratio=0.0,
    clip=0.25,
    steps=400_000,
)

#: Compressive Transformer (Rae et al. 2019, arXiv 1911.05507, sec. 5 / appendix): Adam, linear
#: warmup to 3e-4 over 4,000 steps (character-level corpora; 16,000 for words), cosine decay to
#: 1e-6 over 100,000 steps, gradient-norm clip 0.1. Deviations: the warmup starts at lr / 4000
#: (ours) instead of 1e-6; the paper's switch after 60k iterations to one update every 4 steps
#: instead of decaying the lr is not implemented.
COMPRESSIVE_RECIPE = TrainRecipe(
    name="compressive",
    source="Rae et al. 2019, sec. 5, character-level",
    optimizer="adam",
    lr=3e-4,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    warmup=4000,
    schedule="cosine",
    min_lr_ratio=1e-6 / 3e-4,
    clip=0.1,
    steps=100_000,
    notes="warmup starts at lr/warmup, not 1e-6; no every-4-steps phase after 60k",
)

#: Funnel-Transformer MLM pretraining (Dai et al. 2020, arXiv 2006.03236, base scale: 1M steps),
#: BERT-style: Adam with decoupled weight decay 0.01 not applied to biases and LayerNorm
#: weights, lr 1e-4, 10k warmup steps, then linear decay to 0. Betas (0.9, 0.99), eps 1e-6 and
#: clip 1.0 are the defaults of the official ``tensorflow/optimization.py`` (its pretraining
#: scripts are not released).
FUNNEL_RECIPE = TrainRecipe(
    name="funnel",
    source="Dai et al. 2020, MLM pretraining (BERT-style)",
    optimizer="adamw",
    lr=1e-4,
    betas=(0.9, 0.99),
    eps=1e-6,
    weight_decay=0.01,
    no_decay="bias-norm",
    warmup=10_000,
    schedule="linear",
    min_lr_ratio=0.0,
    clip=1.0,
    steps=1_000_000,
)

#: Transformer translation (Vaswani et al. 2017, arXiv 1706.03762, sec. 5.3; fairseq's
#: ``inverse_sqrt``): Adam betas (0.9, 0.98), eps 1e-9, linear warmup over 4,000 steps to
#: d^-0.5 * 4000^-0.5 (7e-4 at d 512) and decay with the inverse square root of the step; no
#: weight decay, no clipping. Label smoothing (0.1) and dropout (0.1) are model-config fields.
SEQ2SEQ_RECIPE = TrainRecipe(
    name="seq2seq",
    source="Vaswani et al. 2017, sec. 5.3 (fairseq inverse_sqrt)",
    optimizer="adam",
    lr=7e-4,
    betas=(0.9, 0.98),
    eps=1e-9,
    weight_decay=0.0,
    warmup=4000,
    schedule="inverse_sqrt",
    clip=None,
    steps=100_000,
)

#: Reformer (Kitaev et al. 2020, arXiv 2001.04451; trax ``supervised/configs/reformer_enwik8.gin``):
#: Adam (0.9, 0.98), eps 1e-9, no weight decay, no clipping; trax's ``multifactor`` schedule
#: ``constant * linear_warmup * rsqrt_decay`` with constant 0.03125 (d_model^-0.5 at d 1024) and
#: 2,000 warmup steps, i.e. a linear warmup to 0.03125 / sqrt(2000) = 6.99e-4 and then the
#: inverse square root of the step; 100,000 steps. Dropout (0.2 on enwik8) is a model-config field.
REFORMER_RECIPE = TrainRecipe(
    name="reformer",
    source="Kitaev et al. 2020, trax reformer_enwik8.gin",
    optimizer="adam",
    lr=0.03125 / math.sqrt(2000),
    betas=(0.9, 0.98),
    eps=1e-9,
    weight_decay=0.0,
    warmup=2000,
    schedule="inverse_sqrt",
    clip=None,
    steps=100_000,
)

#: Sparse Transformer (Child et al. 2019, arXiv 1904.10509, sec. 7 "Training"): Adam with a
#: linear warmup over 5,000 iterations, gradient clipping at 1.0 and weight decay 0.01, then a
#: cosine decay (as in Radford et al. 2018). Registered for the ``sparse-*`` model names (family
#: ``vanilla``, whose own recipe stays the project default). Choices the text leaves open: the
#: weight decay is decoupled (AdamW), as in the Radford et al. recipe the paper follows, on the
#: matrices only; Adam's default betas; the decay runs to 0 (``min_lr_ratio`` 0). The peak
#: learning rate is not among what the sources checked here state (the paper's text, its
#: released kernels): the project's 1e-3 is kept and named as ours in ``source``.
SPARSE_RECIPE = TrainRecipe(
    name="sparse",
    source="Child et al. 2019, sec. 7 (peak lr 1e-3: the project's, the paper's not checked)",
    optimizer="adamw",
    lr=1e-3,
    weight_decay=0.01,
    no_decay="1d",
    warmup=5000,
    schedule="cosine",
    min_lr_ratio=0.0,
    clip=1.0,
)

#: Adaptive Attention Span (Sukhbaatar et al. 2019, arXiv 1905.07799; official
#: ``experiments/enwik8.sh`` and ``text8.sh``, the base model): Adagrad at lr 0.07 with the
#: per-parameter step clip 0.03 (``--optim adagrad --grad-clip 0.03``,
#: :class:`effiformer.optim.AdagradParamClip`), a linear warmup over 32,000 steps and then a
#: constant lr (``--lr-warmup 32000``), no weight decay, 600,000 steps (``--niter 600 --nbatches
#: 1000``; text8's script runs 900,000). The span penalty (``--adapt-span-loss``) is the attention
#: config's ``penalty``. Registered for ``adaptive-span-base`` and the other ``adaptive-span-*``
#: names without a recipe of their own (their family is ``xl``, whose own recipe stays
#: Transformer-XL's); the small and large scripts differ (below).
ADAPTIVE_SPAN_RECIPE = TrainRecipe(
    name="adaptive-span",
    source="Sukhbaatar et al. 2019, experiments/enwik8.sh",
    optimizer="adagrad-clip",
    lr=0.07,
    eps=1e-10,
    weight_decay=0.0,
    warmup=32_000,
    schedule="constant",
    clip=0.03,
    steps=600_000,
    notes="text8.sh: 900,000 steps",
)

#: ``experiments/enwik8_small.sh``: the base recipe with an 8,000-step warmup (``--lr-warmup
#: 8000``) and 150,000 steps (``--niter 150``).
ADAPTIVE_SPAN_SMALL_RECIPE = dataclasses.replace(
    ADAPTIVE_SPAN_RECIPE,
    name="adaptive-span-small",
    source="Sukhbaatar et al. 2019, experiments/enwik8_small.sh",
    warmup=8_000,
    steps=150_000,
    notes="",
)

#: ``experiments/enwik8_large.sh``: the base recipe for 150,000 steps (``--niter 150``), then a
#: second run of 20,000 steps at a 10x smaller lr (``--lr 0.007 --niter 170``), which the trainer
#: takes as a resume: ``effiformer train --resume RUN --lr 0.007 --steps 170000``
#: (``text8_large.sh``: 250,000 then 270,000).
ADAPTIVE_SPAN_LARGE_RECIPE = dataclasses.replace(
    ADAPTIVE_SPAN_RECIPE,
    name="adaptive-span-large",
    source="Sukhbaatar et al. 2019, experiments/enwik8_large.sh",
    steps=150_000,
    notes="then --resume RUN --lr 0.007 --steps 170000 (the script's fine-tuning); text8_large.sh: "
    "250,000 then 270,000",
)

#: Routing Transformer (Roy et al. 2020; google-research ``routing_transformer``'s
#: ``sparse_transformer_local`` hparams, shared by the released configurations): Adafactor with
#: beta1 0 (no momentum), the second-moment decay ``1 - t^-0.8`` (``decay_type="pow"``,
#: ``memory_exponent`` 0.8), update clipping at 1.0, steps scaled by the parameter's RMS
#: (``multiply_by_parameter_scale``), lr ``0.01 * rsqrt(max(step, 10000)) / rsqrt(10000)``
#: (``constant*rsqrt_normalized_decay``, 10,000 warmup steps: flat, then the inverse square
#: root), no gradient clipping, no weight decay. ``torch.optim.Adafactor`` is that optimizer, and
#: its relative step ``min(lr, 1/sqrt(step))`` at lr 0.01 is exactly that schedule, so the
#: trainer's own schedule is constant with no warmup. Registered for ``routing-enwik8`` and
#: ``routing-pg19``; WikiText-103 adds weight decay 2e-5 (:data:`ROUTING_WT103_RECIPE`; torch's
#: Adafactor decays decoupled, tensor2tensor adds an L2 term to the loss).
ROUTING_RECIPE = TrainRecipe(
    name="routing",
    source="Roy et al. 2020, routing_transformer/sparse_transformer.py (sparse_transformer_local)",
    optimizer="adafactor",
    lr=0.01,
    weight_decay=0.0,
    warmup=0,
    schedule="constant",
    clip=None,
    notes="Adafactor's relative step min(0.01, 1/sqrt(step)) is the official "
    "constant*rsqrt_normalized_decay with 10,000 warmup steps",
)

#: ``wikitext103_local4k`` (and so ``wikitext103_local_cluster4k``): the routing recipe with
#: weight decay 2e-5.
ROUTING_WT103_RECIPE = dataclasses.replace(
    ROUTING_RECIPE,
    name="routing-wikitext103",
    source="Roy et al. 2020, routing_transformer/sparse_transformer.py (wikitext103_local4k)",
    weight_decay=2e-5,
)

#: Lite Transformer, WMT'14 En-De (Wu et al. 2020, arXiv 2004.11886; official
#: ``configs/wmt16.en-de/attention/multibranch_v2/embed{200,408,496}.yml``): Adam (0.9, 0.98)
#: (fairseq's eps 1e-8), no weight decay, no clipping (``clip-norm 0``); fairseq's ``cosine``
#: schedule: linear warmup over 10,000 updates (from ``warmup-init-lr`` 1e-7) to ``max-lr``
#: 1e-3, then one cosine period of 40,000 updates down to ``lr`` 1e-7 (fairseq's cosine reads
#: ``--lr`` as its floor), 50,000 updates in all of 4096 tokens x ``update-freq`` 16 x 8 GPUs.
#: Label smoothing 0.1 and the per-size dropouts are model-config fields. Deviation: the warmup
#: starts at ``lr / warmup`` (the trainer's) rather than 1e-7.
LITE_WMT_RECIPE = TrainRecipe(
    name="lite-wmt",
    source="Wu et al. 2020, configs/wmt16.en-de multibranch_v2 (fairseq cosine)",
    optimizer="adam",
    lr=1e-3,
    betas=(0.9, 0.98),
    eps=1e-8,
    weight_decay=0.0,
    warmup=10_000,
    schedule="cosine",
    min_lr_ratio=1e-7 / 1e-3,
    clip=None,
    steps=50_000,
    notes="warmup starts at lr/warmup, not 1e-7; 131k tokens a step (4096 x 16 x 8 GPUs)",
)

#: Lite Transformer, WMT'14 En-Fr (official ``configs/wmt14.en-fr/...``): as
#: :data:`LITE_WMT_RECIPE` with a 5,000-update warmup and a 45,000-update cosine period.
LITE_WMT_EN_FR_RECIPE = TrainRecipe(
    name="lite-wmt-en-fr",
    source="Wu et al. 2020, configs/wmt14.en-fr multibranch_v2 (fairseq cosine)",
    optimizer="adam",
    lr=1e-3,
    betas=(0.9, 0.98),
    eps=1e-8,
    weight_decay=0.0,
    warmup=5_000,
    schedule="cosine",
    min_lr_ratio=1e-7 / 1e-3,
    clip=None,
    steps=50_000,
    notes="warmup starts at lr/warmup, not 1e-7; 131k tokens a step (4096 x 16 x 8 GPUs)",
)

#: Lite Transformer, IWSLT'14 De-En (official ``configs/iwslt14.de-en/.../embed{160,240,320}.yml``):
#: Adam (0.9, 0.98), lr 5e-4, fairseq's ``inverse_sqrt`` with 4,000 warmup updates, weight decay
#: 1e-4 (Adam's L2 term, as fairseq's ``adam``), no clipping, 50,000 updates of 4096 tokens.
#: Deviation: fairseq decays every parameter; the ``1d`` rule here spares biases and norms.
LITE_IWSLT_RECIPE = TrainRecipe(
    name="lite-iwslt",
    source="Wu et al. 2020, configs/iwslt14.de-en multibranch_v2 (fairseq inverse_sqrt)",
    optimizer="adam",
    lr=5e-4,
    betas=(0.9, 0.98),
    eps=1e-8,
    weight_decay=1e-4,
    no_decay="1d",
    warmup=4000,
    schedule="inverse_sqrt",
    clip=None,
    steps=50_000,
    notes="weight decay spares 1-d parameters (fairseq decays all); warmup from lr/warmup",
)

_RECIPES: dict[str, TrainRecipe] = {}
_MODEL_RECIPES: dict[str, TrainRecipe] = {}


def register_recipe(family: str, recipe: TrainRecipe) -> None:
    """Register ``recipe`` as the training recipe of ``family`` (once per family)."""
    if not isinstance(recipe, TrainRecipe):
        raise TypeError(f"recipe must be a TrainRecipe, got {type(recipe).__name__}")
    if family in _RECIPES and _RECIPES[family] != recipe:
        raise ValueError(f"family {family!r} already has a training recipe")
    _RECIPES[family] = recipe


def get_recipe(family: str) -> TrainRecipe:
    """The recipe ``family`` registered (families register when :mod:`effiformer.models` is
    imported)."""
    if family not in _RECIPES:
        known = ", ".join(sorted(_RECIPES)) or "none yet (import effiformer.models)"
        raise KeyError(f"no training recipe registered for family {family!r}; registered: {known}")
    return _RECIPES[family]


def list_recipes() -> dict[str, TrainRecipe]:
    """Every registered recipe by family."""
    return dict(_RECIPES)


def register_model_recipe(pattern: str, recipe: TrainRecipe) -> None:
    """Register ``recipe`` for the registered model names matching the glob ``pattern``
    (``"lite-wmt-*"``): :func:`recipe_for` takes it before the family's. For papers whose models
    are configurations of another family trained with their own recipe."""
    if not isinstance(recipe, TrainRecipe):
        raise TypeError(f"recipe must be a TrainRecipe, got {type(recipe).__name__}")
    if pattern in _MODEL_RECIPES and _MODEL_RECIPES[pattern] != recipe:
        raise ValueError(f"model names {pattern!r} already have a training recipe")
    _MODEL_RECIPES[pattern] = recipe


def list_model_recipes() -> dict[str, TrainRecipe]:
    """Every recipe registered for model names, by glob."""
    return dict(_MODEL_RECIPES)


def recipe_for(model_name: str | None, family: str) -> TrainRecipe:
    """The recipe of registered model ``model_name``: that of the longest glob registered with
    :func:`register_model_recipe` that matches the name, else the family's (:func:`get_recipe`)."""
    if model_name:
        hits = [p for p in _MODEL_RECIPES if fnmatch.fnmatchcase(model_name, p)]
        if hits:
            return _MODEL_RECIPES[max(hits, key=len)]
    return get_recipe(family)


@dataclass(frozen=True)
class RecipeChoice:
    """What :func:`apply_recipe` decided: ``values`` (the :data:`RECIPE_FIELDS` as
    ``TrainConfig`` keyword arguments), which fields the caller ``overridden``, and the warmup
    cap applied (``(recipe warmup, capped warmup)``, or ``None``)."""

    recipe: TrainRecipe
    values: dict[str, Any]
    overridden: tuple[str, ...]
    steps: int | None
    warmup_capped: tuple[int, int] | None = None

    def describe(self) -> str:
        """``recipe xl (Dai et al. 2019, ...): Adam lr 0.00025, ...`` (without the overrides,
        which the caller names in its own vocabulary: flags, keyword arguments)."""
        return (
            f"recipe {self.recipe.name} ({self.recipe.source}): "
            f"{describe_training(self.values, steps=self.steps, warmup_capped=self.warmup_capped)}"
        )


def apply_recipe(
    recipe: TrainRecipe, *, steps: int | None, overrides: Mapping[str, Any] | None = None
) -> RecipeChoice:
    """``recipe``'s values with ``overrides`` (a subset of :data:`RECIPE_FIELDS`) applied for a
    run of ``steps`` steps. A recipe warmup longer than 10% of the run is capped at
    ``max(1, steps // 10)`` unless ``warmup`` is overridden; nothing else changes. ``steps=None``
    (a schedule the trainer sizes from a time budget): no cap here, the trainer applies it
    (``TrainConfig.planned_warmup_cap``)."""
    overrides = dict(overrides or {})
    bad = sorted(set(overrides) - set(RECIPE_FIELDS))
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a recipe field; recipe fields: {RECIPE_FIELDS}")
    values = recipe.values()
    capped = None
    cap = max(1, steps // 10) if steps is not None else None
    if cap is not None and "warmup" not in overrides and values["warmup"] > cap:
        capped = (values["warmup"], cap)
        values["warmup"] = cap
    values.update(overrides)
    order = [f.name for f in fields(TrainRecipe)]
    return RecipeChoice(
        recipe=recipe,
        values=values,
        overridden=tuple(sorted(overrides, key=order.index)),
        steps=steps,
        warmup_capped=capped,
    )


_OPTIMIZER_NAMES = {
    "adamw": "AdamW",
    "adam": "Adam",
    "adagrad": "Adagrad",
    "adagrad-clip": "Adagrad",
    "adafactor": "Adafactor",
}


def describe_training(
    values: Mapping[str, Any], *, steps: int | None = None, warmup_capped: tuple | None = None
) -> str:
    """One human line for the :data:`RECIPE_FIELDS` in ``values``, e.g. ``Adam lr 0.00025,
    betas (0.9, 0.999), eps 1e-08, cosine to 0, warmup 0, clip 0.25, no weight decay``."""
    v = values
    lr = float(v["lr"])
    parts = [f"{_OPTIMIZER_NAMES.get(v['optimizer'], v['optimizer'])} lr {lr:g}"]
    if v["optimizer"] == "adafactor":
        parts.append("no momentum, relative step min(lr, 1/sqrt(step)) x RMS(param)")
    else:
        if not v["optimizer"].startswith("adagrad"):
            b1, b2 = v["betas"]
            parts.append(f"betas ({b1:g}, {b2:g})")
        parts.append(f"eps {float(v['eps']):g}")
    floor = lr * float(v["min_lr_ratio"])
    if v["schedule"] in ("cosine", "linear"):
        parts.append(f"{v['schedule']} to {floor:.3g}")
    elif v["schedule"] == "inverse_sqrt":
        parts.append("inverse-sqrt decay")
    else:
        parts.append("constant")
    if warmup_capped is not None:
        parts.append(
            f"warmup {warmup_capped[0]} capped to {warmup_capped[1]} (10% of this {steps}-step run)"
        )
    else:
        parts.append(f"warmup {v['warmup']}")
    if not v["clip"]:
        parts.append("no clipping")
    elif v["optimizer"] == "adagrad-clip":
        parts.append(f"per-parameter step clip {float(v['clip']):g}")
    else:
        parts.append(f"clip {float(v['clip']):g}")
    if not v["weight_decay"]:
        parts.append("no weight decay")
    else:
        where = {
            "1d": "matrices only",
            "bias-norm": "not on biases/norms",
            "bias-norm-embedding": "not on biases/norms/embeddings",
        }[v["no_decay"]]
        parts.append(f"weight decay {float(v['weight_decay']):g} ({where})")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------
# Decoding conventions: how each paper searched when it reported BLEU
# ------------------------------------------------------------------------------------------

#: Length-penalty forms beam search divides a hypothesis' log-probability by: ``fairseq``
#: (``--lenpen``): ``length ** lenpen``; ``gnmt`` (Wu et al. 2016, eq. 14; tensor2tensor's
#: ``alpha``, which Vaswani et al. 2017 sec. 6.1 set to 0.6): ``((5 + length) / 6) ** lenpen``.
LENPEN_FORMS = ("fairseq", "gnmt")


@dataclass(frozen=True, kw_only=True)
class DecodingRecipe:
    """How a paper decoded for its reported BLEU: ``beam``, the length penalty ``lenpen`` and its
    ``lenpen_form`` (:data:`LENPEN_FORMS`); ``source``: the paper and script it comes from;
    ``average``: how many last checkpoints the paper averaged (informative: ``effiformer
    average RUN --last N`` does it; 0 = none); ``notes``: what differs here."""

    name: str
    source: str
    beam: int = 5
    lenpen: float = 1.0
    lenpen_form: str = "fairseq"
    average: int = 0
    notes: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.beam, bool) or not isinstance(self.beam, int) or self.beam < 1:
            raise ConfigError(f"beam must be a positive int, got {self.beam!r}")
        if not math.isfinite(self.lenpen):
            raise ConfigError(f"lenpen must be a finite number, got {self.lenpen!r}")
        if self.lenpen_form not in LENPEN_FORMS:
            raise ConfigError(
                f"lenpen_form must be one of {list(LENPEN_FORMS)}, got {self.lenpen_form!r}"
            )

    def describe(self) -> str:
        """``beam 4, lenpen 0.6 (gnmt) [Vaswani et al. 2017 ...]``."""
        form = f" ({self.lenpen_form})" if self.lenpen_form != "fairseq" else ""
        return f"beam {self.beam}, lenpen {self.lenpen:g}{form} [{self.source}]"


VASWANI_DECODING = DecodingRecipe(
    name="vaswani",
    source="Vaswani et al. 2017 sec. 6.1 (tensor2tensor): beam 4, alpha 0.6",
    beam=4,
    lenpen=0.6,
    lenpen_form="gnmt",
    average=5,
    notes="the paper averages the last 5 checkpoints (base; 20 for big), written every 10 "
    "minutes: effiformer average RUN --last N averages the last N kept checkpoints",
)
FAIRSEQ_IWSLT_DECODING = DecodingRecipe(
    name="fairseq-iwslt",
    source="fairseq examples/translation, IWSLT'14 De-En: beam 5",
)
LITE_WMT_DECODING = DecodingRecipe(
    name="lite-wmt",
    source="Lite Transformer configs/wmt16.en-de/test.sh: beam 4, lenpen 0.6",
    beam=4,
    lenpen=0.6,
    notes="the best checkpoint, not an average",
)
LITE_IWSLT_DECODING = DecodingRecipe(
    name="lite-iwslt",
    source="Lite Transformer configs/iwslt14.de-en/test.sh: beam 4, last 10 checkpoints averaged",
    beam=4,
    average=10,
)
HAT_WMT_DECODING = DecodingRecipe(
    name="hat-wmt",
    source="HAT configs/wmt14.en-de/test.sh: beam 4, lenpen 0.6",
    beam=4,
    lenpen=0.6,
)
HAT_IWSLT_DECODING = DecodingRecipe(
    name="hat-iwslt",
    source="HAT configs/iwslt14.de-en/test.sh: beam 5, last 10 checkpoints averaged",
    average=10,
)

#: What every model without a registered convention decodes with: fairseq-generate's defaults.
DEFAULT_DECODING = DecodingRecipe(
    name="default", source="fairseq-generate's defaults (beam 5, lenpen 1)"
)
_MODEL_DECODING: dict[str, DecodingRecipe] = {}


def register_model_decoding(pattern: str, decoding: DecodingRecipe) -> None:
    """Register the paper's decoding convention for the model names matching the glob
    ``pattern``; ``effiformer eval`` and ``effiformer translate`` take it unless flags say
    otherwise (:func:`decoding_for`)."""
    if not isinstance(decoding, DecodingRecipe):
        raise TypeError(f"decoding must be a DecodingRecipe, got {type(decoding).__name__}")
    if pattern in _MODEL_DECODING and _MODEL_DECODING[pattern] != decoding:
        raise ValueError(f"model names {pattern!r} already have a decoding convention")
    _MODEL_DECODING[pattern] = decoding


def decoding_for(model_name: str | None) -> DecodingRecipe:
    """The decoding convention of registered model ``model_name`` (the longest matching glob),
    else :data:`DEFAULT_DECODING`."""
    if model_name:
        hits = [p for p in _MODEL_DECODING if fnmatch.fnmatchcase(model_name, p)]
        if hits:
            return _MODEL_DECODING[max(hits, key=len)]
    return DEFAULT_DECODING
