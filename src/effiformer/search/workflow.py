"""The three steps of a search as the command line runs them (``effiformer search
latency-data | predictor | evolve``): each a function of files and options, returning records
the CLI prints. HAT's SubTransformers and registered families go through the same steps; which
one a latency file holds is read from its header (HAT's 14 columns, or a family's keys followed
by ``latency_ms``, ``latency_std_ms``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..models.hat import DesignSpace, get_space
from .features import FEATURE_NAMES, HAT_FEATURE_NORM, HAT_LATENCY_NORM, space_feature_norm
from .predictor import PredictorReport, compare_predictors, hat_proxies, save_predictor

__all__ = [
    "evolve_family",
    "evolve_supernet_run",
    "family_space_from_meta",
    "latency_kind",
    "train_predictor_from_csv",
]


def latency_kind(path: str | os.PathLike) -> str:
    """``"hat"`` or ``"family"``: what a latency CSV holds (from its header)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no latency dataset at {str(path)!r}")
    with open(path) as f:
        header = f.readline().strip().split(",")
    if header[:10] == list(FEATURE_NAMES):
        return "hat"
    if header[-2:] == ["latency_ms", "latency_std_ms"]:
        return "family"
    raise ValueError(f"{path}: neither a HAT nor a family latency file (header {header[:4]}...)")


def family_space_from_meta(meta: dict[str, Any]):
    """The :class:`~effiformer.search.family.FamilySpace` a family dataset's sidecar records."""
    from .family import FamilySpace

    rec = meta["space"]
    choices = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
               for k, v in rec["choices"].items()}  # fmt: skip
    return FamilySpace.create(rec["model"], choices, rec.get("fixed") or {})


def train_predictor_from_csv(
    path: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    hat_device: str | None = None,
    lat_norm: float | None = None,
    steps: int = 5000,
    batch: int = 128,
    lr: float = 1e-5,
    seed: int = 0,
    qkv_dim: int | None = None,
) -> tuple[PredictorReport, dict[str, Any]]:
    """Train HAT's predictor on a latency CSV and compare it with the baselines (a linear fit
    on the features; on a HAT file also linear fits on HAT's Mult-Adds and on the decoding
    workload's Mult-Adds). Feature scales: HAT's official ones for its released files
    (``hat_device``: ``xeon``, ``titanxp``, ``raspberrypi`` also picks its ``lat-norm``), else the
    largest value of each feature in the dataset's space; ``lat_norm`` default: the training
    rows' mean latency. Saves the predictor to ``out`` (with the settings and errors) when
    given. Returns the report and a JSON-able record."""
    from .latency import _read_sidecar, _sidecar, read_latency_csv

    kind = latency_kind(path)
    side = _sidecar(Path(path))
    meta = _read_sidecar(side)[0] if side.is_file() else None
    if kind == "hat":
        data = read_latency_csv(path)
        x, y = data.features, data.latency_ms
        space: DesignSpace | None = get_space(meta["space"]) if meta else None
        if hat_device is not None:
            if hat_device not in HAT_LATENCY_NORM:
                raise ValueError(f"hat_device must be one of {sorted(HAT_LATENCY_NORM)}")
            norm, lat = list(HAT_FEATURE_NORM), HAT_LATENCY_NORM[hat_device]
        else:
            norm = list(space_feature_norm(space)) if space is not None else list(HAT_FEATURE_NORM)
            lat = None
        q = qkv_dim or (space.qkv_dim if space is not None else 512)
        src_len = meta["settings"]["src_len"] if meta else 30
        beam = meta["settings"]["beam"] if meta else 5
        proxies = hat_proxies(x, q, src_len=src_len, beam=beam)
        names = list(FEATURE_NAMES)
    else:
        from .family import read_family_csv

        fam = read_family_csv(path)
        x, y = fam.features, fam.latency_ms
        if fam.meta is None:
            raise ValueError(f"{path} has no sidecar: the family space is unknown")
        norm = family_space_from_meta(fam.meta).feature_norm()
        lat, proxies, names = None, {}, fam.feature_names
    if lat_norm is not None:
        lat = float(lat_norm)
    if lat is None:
        from .predictor import split_indices

        lat = float(np.mean(y[split_indices(len(y), seed)[0]]))
    report = compare_predictors(
        x, y, proxies, feature_norm=norm, lat_norm=lat, seed=seed, steps=steps, batch=batch,
        lr=lr, feature_names=names,
    )  # fmt: skip
    record = {
        "data": str(path),
        "kind": kind,
        "rows": len(y),
        "split": list(report.sizes),
        "feature_norm": norm,
        "lat_norm": lat,
        "steps": steps,
        "lr": lr,
        "batch": batch,
        "seed": seed,
        "test": report.results,
    }
    if out is not None:
        record["predictor"] = str(save_predictor(report.mlp, out, **record))
    return report, record


def evolve_supernet_run(
    run: str | os.PathLike,
    predictor: str | os.PathLike,
    limit_ms: float,
    *,
    data: str | os.PathLike | None = None,
    split: str = "valid",
    sentences: int | None = 500,
    max_tokens: int = 4096,
    device: str = "cpu",
    export: str | os.PathLike | None = None,
    **evolution: Any,
):
    """HAT's search on a trained SuperTransformer run: fitness = validation loss on the first
    ``sentences`` pairs of ``split`` of the run's data (or ``data``), latency = the saved
    predictor's. ``export``: also save the best SubTransformer with its inherited weights (and
    the tokenizer) as a standalone checkpoint there. Returns (SearchResult, JSON record)."""
    from ..data.parallel import ParallelData
    from ..models.hat import export_subtransformer
    from ..tasks.translation import TranslationTask
    from .hat import load_supernet_run, result_record, search_subtransformer, validation_batches
    from .predictor import load_predictor

    model, tokenizer, meta = load_supernet_run(run, device=device)
    saved = meta.get("task") or {}
    pair = meta.get("pair") or {"src": saved.get("src"), "tgt": saved.get("tgt")}
    root = data if data is not None else (saved.get("data") or {}).get("path")
    if root is None or pair["src"] is None:
        raise ValueError(f"{meta['path']} does not record its data folder and languages: pass data")
    task = TranslationTask(ParallelData(root, pair["src"], pair["tgt"]), tokenizer)
    batches = validation_batches(task, split, sentences=sentences, max_tokens=max_tokens)
    pred, pmeta = load_predictor(predictor)
    if pred.n_features != len(FEATURE_NAMES):
        raise ValueError(f"{predictor} predicts from {pred.n_features} features, not HAT's ten")
    result = search_subtransformer(model, pred, limit_ms, batches, device=device, **evolution)
    record = result_record(result, model.config.space.qkv_dim)
    record.update({"run": meta["path"], "predictor": str(predictor), "split": split,
                   "sentences": sentences, "predictor_data": pmeta.get("data")})  # fmt: skip
    if export is not None:
        out = Path(export)
        standalone = export_subtransformer(model, result.best)
        export_run(standalone, out, meta, tokenizer, pair)
        record["exported"] = str(out)
    return result, record


def export_run(
    standalone: Any, out: Path, meta: dict[str, Any], tokenizer: Any, pair: dict[str, Any]
) -> Path:
    """Write an exported SubTransformer as a run folder of its own (``OUT/latest`` ->
    ``OUT/step-N``, N the SuperTransformer's step): weights and config, the tokenizer and the
    language pair, and a ``meta.json`` whose task is the SuperTransformer run's translation
    task, so that ``effiformer eval OUT`` scores it on the run's data and ``effiformer translate
    OUT`` decodes with it. ``train_config.json`` records where it came from; it is not a run to
    ``--resume`` (HAT trains a searched SubTransformer anew, ``effiformer train``)."""
    import tempfile

    from ..checkpoint import RecordedTask, save_run_checkpoint
    from ..tasks.translation import PAIR_FILE

    described = {k: v for k, v in (meta.get("task") or {}).items() if k != "supernet"}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir()}
    files[PAIR_FILE] = (json.dumps(pair) + "\n").encode()
    return save_run_checkpoint(
        out,
        int(meta.get("step") or 0),
        standalone,
        trainer_state={"exported_from": meta.get("path"), "sub": standalone.config.sub},
        train_config={"exported_from": meta.get("path"), "kind": "hat-subtransformer"},
        task=RecordedTask(described, files),
        model_name="hat-subtransformer",
    )


def evolve_family(
    data: str | os.PathLike,
    predictor: str | os.PathLike,
    limit_ms: float,
    *,
    fitness: str = "params",
    **evolution: Any,
):
    """A family search: the space from the latency dataset's sidecar, its predictor, fitness
    ``"params"`` (the most parameters under the limit). Returns (SearchResult, JSON record)."""
    from .family import params_fitness, read_family_csv, search_family
    from .predictor import load_predictor

    fam = read_family_csv(data)
    if fam.meta is None:
        raise ValueError(f"{data} has no sidecar: the family space is unknown")
    space = family_space_from_meta(fam.meta)
    pred, _ = load_predictor(predictor)
    if fitness != "params":
        raise ValueError("the command line's family fitness is 'params'; train-based fitness "
                         "is effiformer.search.family.training_fitness")  # fmt: skip
    result = search_family(space, pred, limit_ms, params_fitness(space), **evolution)
    record = {
        "limit_ms": result.limit,
        "model": space.model,
        "best": {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in result.best.items()},
        "best_fitness": result.best_fitness,
        "fitness": fitness,
        "best_predicted_ms": result.best_latency,
        "draws": result.draws,
        "evaluated": [[e.latency, e.fitness] for e in result.evaluated],
    }
    return result, record
