"""HAT's search, end to end: a trained SuperTransformer, a latency predictor and a limit in,
the best SubTransformer (and the search's history) out (HAT sec. 3.3, official
``evo_search.py``).

- fitness: the **validation loss** of the SubTransformer with the SuperTransformer's weights
  (inherited, not retrained), on a fixed validation subset (:func:`validation_batches`: the
  first ``sentences`` pairs of a split, batched once), the label-smoothed loss in nats per target
  token, token-weighted over the subset (fairseq's ``valid_loss``, in nats rather than bits);
- latency: the predictor's on the SubTransformer's ten features;
- :func:`search_subtransformer` runs :func:`~effiformer.search.evolution.evolve` over the
  space's genes (:meth:`~effiformer.models.hat.DesignSpace.gene_choices`), two genes being the
  same candidate when their active layers agree.

The chosen SubTransformer is then trained from scratch as a standalone model
(``HATConfig(space=..., sub=best)``, e.g. ``create_model("hat-multi30k-super", sub=best)``)
with the translation task and :func:`effiformer.train.train`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch

from ..models.hat import DesignSpace, SubTransformer, SuperTransformer
from ..models.seq2seq import label_smoothed_nll
from .evolution import SearchResult, evolve
from .features import hat_features
from .predictor import LatencyPredictor

__all__ = [
    "load_supernet_run",
    "predicted_latency",
    "result_record",
    "search_subtransformer",
    "validation_batches",
    "validation_loss",
]


def validation_batches(
    task: Any, split: str = "valid", *, sentences: int | None = 500, max_tokens: int = 4096
) -> list[dict[str, torch.Tensor]]:
    """The first ``sentences`` pairs of ``split`` of a
    :class:`~effiformer.tasks.translation.TranslationTask`, collated once into batches of about
    ``max_tokens`` padded tokens (sorted by length, so little padding)."""
    from ..data.parallel import TokenBatcher

    src, tgt = task.encoded(split)
    n = len(src) if sentences is None else min(sentences, len(src))
    if n == 0:
        raise ValueError(f"split {split!r} is empty")
    s_len = [len(src[i]) + 1 for i in range(n)]
    t_len = [len(tgt[i]) + 1 for i in range(n)]
    batcher = TokenBatcher(s_len, t_len, max(max_tokens, max(s_len), max(t_len)), shuffle=False)
    return [task.collate([src[i] for i in b], [tgt[i] for i in b]) for b in batcher.batches(0)]


@torch.no_grad()
def validation_loss(
    model: SuperTransformer,
    sample: SubTransformer | None,
    batches: list[dict[str, torch.Tensor]],
    *,
    device: torch.device | str = "cpu",
) -> float:
    """Token-weighted label-smoothed loss (nats per target token) of SubTransformer ``sample``
    with ``model``'s weights over ``batches``, in eval mode."""
    was = model.training
    model.eval()
    pad = model.config.pad_id
    total, count = 0.0, 0
    try:
        for b in batches:
            b = {k: v.to(device) for k, v in b.items()}
            out = model(b["input_ids"], b["tgt_in"], sample=sample)
            loss, _ = label_smoothed_nll(
                out.logits, b["targets"], model.config.label_smoothing, ignore=(pad,)
            )
            k = int((b["targets"] != pad).sum())
            total += float(loss.double()) * k
            count += k
    finally:
        model.train(was)
    return total / count


def predicted_latency(predictor: LatencyPredictor) -> Callable[[SubTransformer], float]:
    """SubTransformer -> the predictor's latency (ms) from its ten features."""

    def latency(sub: SubTransformer) -> float:
        return float(predictor.predict([hat_features(sub)])[0])

    return latency


def search_subtransformer(
    model: SuperTransformer,
    latency: LatencyPredictor | Callable[[SubTransformer], float],
    limit_ms: float,
    batches: list[dict[str, torch.Tensor]] | None = None,
    *,
    fitness: Callable[[SubTransformer], float] | None = None,
    space: DesignSpace | None = None,
    device: torch.device | str = "cpu",
    **evolution: Any,
) -> SearchResult:
    """The fittest SubTransformer of ``space`` (default: the model's) whose predicted latency
    is at most ``limit_ms``. ``latency``: a :class:`LatencyPredictor` or any SubTransformer ->
    ms function; ``fitness``: default the validation loss on ``batches``;
    ``evolution``: :func:`~effiformer.search.evolution.evolve`'s keywords (population,
    parents, mutations, crossovers, mutation_prob, iterations, seed, max_tries, progress)."""
    space = model.config.space if space is None else space
    if fitness is None:
        if batches is None:
            raise ValueError("give the validation batches (or a fitness function)")

        def fitness(sub: SubTransformer) -> float:
            return validation_loss(model, sub, batches, device=device)

    lat = predicted_latency(latency) if isinstance(latency, LatencyPredictor) else latency
    if not math.isfinite(limit_ms) or limit_ms <= 0:
        raise ValueError(f"limit_ms must be a positive number, got {limit_ms}")
    return evolve(
        [c for _, _, c in space.gene_choices()],
        space.from_gene,
        fitness,
        lat,
        limit_ms,
        key=lambda sub: sub.trimmed(),
        **evolution,
    )


def load_supernet_run(
    run: str | os.PathLike, *, device: torch.device | str = "cpu"
) -> tuple[SuperTransformer, Any, dict[str, Any]]:
    """(SuperTransformer in eval mode, its tokenizer, the checkpoint meta) of a run directory or
    checkpoint that trained a ``hat`` model on translation (``meta["pair"]``: its languages)."""
    from ..checkpoint import load_checkpoint, resolve_checkpoint
    from ..data.tokenizer import TOKENIZER_FILE, SubwordTokenizer, TokenizerError
    from ..tasks.translation import read_pair

    ckpt = resolve_checkpoint(run)
    model, meta = load_checkpoint(ckpt, map_location=device)
    if not isinstance(model, SuperTransformer):
        raise ValueError(f"{ckpt} holds a {model.config.family!r} model, not a hat one")
    if not (ckpt / TOKENIZER_FILE).is_file():
        raise TokenizerError(f"{ckpt} has no {TOKENIZER_FILE} (was it trained on translation?)")
    tokenizer = SubwordTokenizer.load(ckpt)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise TokenizerError(
            f"{ckpt}: the model has vocab_size={model.config.vocab_size} but its tokenizer "
            f"{tokenizer.vocab_size}"
        )
    meta["pair"] = read_pair(ckpt)
    return model.eval(), tokenizer, meta


def result_record(result: SearchResult, qkv_dim: int) -> dict[str, Any]:
    """A JSON-able summary of a HAT search: the best SubTransformer (ours and the official
    ``.yml`` keys), its fitness, predicted latency, parameters and FLOPs (README conventions),
    the per-iteration best and every distinct candidate scored (latency, fitness)."""
    from .macs import subtransformer_macs, subtransformer_params

    best: SubTransformer = result.best
    return {
        "limit_ms": result.limit,
        "best": best.to_dict(),
        "best_hat_yml": best.to_hat(),
        "best_description": best.describe(),
        "best_fitness": result.best_fitness,
        "best_predicted_ms": result.best_latency,
        "best_params": subtransformer_params(best, qkv_dim),
        "best_gflops": subtransformer_macs(best, qkv_dim).flops / 1e9,
        "draws": result.draws,
        "iterations": [
            {
                "iteration": h["iteration"],
                "best_fitness": h["best_fitness"],
                "best_predicted_ms": h["best_latency"],
            }
            for h in result.history
        ],  # fmt: skip
        "evaluated": [[e.latency, e.fitness] for e in result.evaluated],
    }
