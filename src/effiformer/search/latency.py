"""Latency datasets of SubTransformers, measured on the machine that runs this (HAT sec. 3.2,
official ``latency_dataset.py``).

Each sample is drawn uniformly from a design space (for a dataset: the *latency* space, wider
than training, :func:`~effiformer.models.hat.latency_space`), built as a standalone model of its
own size (:class:`~effiformer.models.hat.HATConfig` with ``sub=``, random weights: latency does
not depend on them) and timed by :func:`effiformer.bench.decoding.decoding_latency`: batch 1,
a dummy sentence of ``src_len`` tokens (HAT: 30 for WMT, 23 for IWSLT), beam 5, the decoder run
incrementally for ``src_len`` steps, ``warmup`` untimed runs, then ``runs`` timed runs and the
mean of the 10-90 % trimmed range, eval mode under ``torch.inference_mode``, ``threads`` pinned.
Deviation: HAT times the SuperTransformer with its weights sliced (views); here the
SubTransformer is a standalone model with contiguous weights, as it would be deployed.

The dataset is a CSV with HAT's 14 columns (:data:`~effiformer.search.features.FEATURE_NAMES`,
then encoder / decoder latency means and standard deviations in ms), readable by HAT's own
``latency_predictor.py``, plus a sidecar ``PATH.jsonl``: a first line with the settings and one
line per row with the full SubTransformer (the features alone lose the per-layer widths). Sample
``i`` is drawn from a generator seeded by ``(seed, i)``, so an interrupted run resumes where it
stopped (``resume``) and draws exactly the samples the uninterrupted run would have.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..bench.decoding import DecodingLatency, decoding_latency
from ..models.hat import (
    DesignSpace,
    HATConfig,
    SubTransformer,
    SuperTransformer,
    get_space,
    sample_generator,
)
from .features import FEATURE_NAMES, LATENCY_COLUMNS, hat_features

__all__ = [
    "LatencyData",
    "LatencySettings",
    "build_latency_dataset",
    "machine",
    "measure_subtransformer",
    "read_latency_csv",
    "resumable_dataset",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LatencySettings:
    """How a dataset's latencies are measured (recorded in its sidecar; a resume must match):
    ``vocab_size`` of the output layer, ``src_len`` (and decoder steps), ``beam``, ``warmup``
    and ``runs`` per measurement, ``threads``, ``device``, and the ``seed`` samples are drawn
    with."""

    vocab_size: int = 8000
    src_len: int = 30
    beam: int = 5
    warmup: int = 5
    runs: int = 20
    threads: int | None = 1
    device: str = "cpu"
    seed: int = 0


def machine(device: str, threads: int | None) -> dict[str, Any]:
    """Where a dataset is measured (recorded in its sidecar): versions, CPU/GPU, threads."""
    from ..bench.harness import environment

    dev = torch.device(device)
    return environment(dev, "float32", threads or torch.get_num_threads(), peak=False)


def measure_subtransformer(
    sub: SubTransformer,
    space: DesignSpace | str,
    settings: LatencySettings = LatencySettings(),
) -> DecodingLatency:
    """Decoding latency of ``sub`` (a standalone model of its size, inside ``space``'s
    SuperTransformer for positions and initialisation) with ``settings``."""
    s = settings
    config = HATConfig(
        space=get_space(space),
        sub=sub,
        vocab_size=s.vocab_size,
        seq_len=s.src_len + 2,
        dropout=0.0,
        attn_dropout=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SuperTransformer(config).to(s.device)
    return decoding_latency(
        model, src_len=s.src_len, beam=s.beam, warmup=s.warmup, runs=s.runs, threads=s.threads
    )


@dataclass
class LatencyData:
    """A latency dataset in memory: ``features`` (N, 10), ``encoder_ms`` / ``decoder_ms`` (N,),
    their spreads, and the SubTransformers when known (from the sidecar; None for HAT's files)."""

    features: np.ndarray
    encoder_ms: np.ndarray
    decoder_ms: np.ndarray
    encoder_std_ms: np.ndarray
    decoder_std_ms: np.ndarray
    subs: list[SubTransformer] | None = None

    @property
    def latency_ms(self) -> np.ndarray:
        """The predictor's target: encoder + decoder."""
        return self.encoder_ms + self.decoder_ms

    def __len__(self) -> int:
        return len(self.features)


def read_latency_csv(path: str | os.PathLike) -> LatencyData:
    """A dataset in HAT's CSV format (its released files or one :func:`build_latency_dataset`
    wrote), with the SubTransformers of the sidecar ``PATH.jsonl`` when there is one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no latency dataset at {str(path)!r}")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        want = [*FEATURE_NAMES, *LATENCY_COLUMNS]
        if header is None or [h.strip() for h in header[:14]] != want:
            raise ValueError(f"{path}: not a HAT latency file (its header must be {want})")
        rows = [[float(v) for v in r[:14]] for r in reader if r]
    if not rows:
        raise ValueError(f"{path}: no rows")
    a = np.asarray(rows, dtype=np.float64)
    subs = None
    side = _sidecar(path)
    if side.is_file():
        recs = _read_sidecar(side)[1]
        if len(recs) >= len(a):
            subs = [SubTransformer.from_dict(r["sub"]) for r in recs[: len(a)]]
    return LatencyData(a[:, :10], a[:, 10], a[:, 11], a[:, 12], a[:, 13], subs)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".jsonl")


def _read_sidecar(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    meta, recs = None, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut by a crash: everything after it is redone
        if "settings" in rec:
            meta = rec
        else:
            recs.append(rec)
    return meta, recs


def _csv_rows(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [line for line in lines[1:] if line.strip()] if lines else []


def build_latency_dataset(
    path: str | os.PathLike,
    space: DesignSpace | str,
    n: int,
    settings: LatencySettings = LatencySettings(),
    *,
    resume: bool = True,
    progress: bool = True,
    measure: Callable[[SubTransformer], DecodingLatency] | None = None,
) -> LatencyData:
    """Measure ``n`` SubTransformers drawn from ``space`` into ``path`` (HAT's CSV + sidecar;
    see the module docstring) and return the dataset. With ``resume`` an existing dataset with
    the same settings is continued (rows beyond what both files hold are redone); without it an
    existing file is an error. ``measure``: replaces :func:`measure_subtransformer` (tests)."""
    space = get_space(space)
    meta = {
        "settings": asdict(settings),
        "space": space.to_dict(),
        "format": "hat-latency-v1",
        "environment": machine(settings.device, settings.threads),
    }
    measure = measure or (lambda sub: measure_subtransformer(sub, space, settings))

    def draw(i: int) -> tuple[dict[str, Any], list[float]]:
        sub = space.sample(sample_generator(settings.seed, i)).trimmed()
        return {"sub": sub.to_dict()}, hat_features(sub)

    def run(i: int, record: dict[str, Any]) -> list[float]:
        lat = measure(SubTransformer.from_dict(record["sub"]))
        return [lat.encoder_s * 1e3, lat.decoder_s * 1e3, lat.encoder_std_s * 1e3,
                lat.decoder_std_s * 1e3]  # fmt: skip

    resumable_dataset(
        path, n, meta, [*FEATURE_NAMES, *LATENCY_COLUMNS], draw, run,
        resume=resume, progress=progress, total=lambda v: v[0] + v[1],
    )  # fmt: skip
    return read_latency_csv(path)


def resumable_dataset(
    path: str | os.PathLike,
    n: int,
    meta: dict[str, Any],
    header: list[str],
    draw: Callable[[int], tuple[dict[str, Any], list[float]]],
    measure: Callable[[int, dict[str, Any]], list[float]],
    *,
    resume: bool = True,
    progress: bool = True,
    total: Callable[[list[float]], float] | None = None,
) -> None:
    """The resumable CSV + sidecar writer behind every latency dataset: row ``i`` is
    ``draw(i)`` -> (the sidecar record, the feature values), then ``measure(i, record)`` -> the
    measured values; ``meta`` (the settings) must equal a resumed dataset's. Rows are appended
    as they are measured (sidecar first), so a killed run loses at most the row in flight."""
    from ..progress import progress_bar, progress_enabled

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    path = Path(path)
    side = _sidecar(path)
    done = 0
    if path.exists() or side.exists():
        if not resume:
            raise FileExistsError(f"{path} exists; pass resume=True to continue it")
        old_meta, recs = _read_sidecar(side) if side.exists() else (None, [])
        if old_meta is None:
            raise ValueError(f"{path} has no readable sidecar {side.name}: cannot resume it")
        if {k: v for k, v in old_meta.items() if k != "environment"} != {
            k: v for k, v in meta.items() if k != "environment"
        }:
            raise ValueError(
                f"{path} was measured with other settings or another space "
                f"({old_meta.get('settings')}); use another path"
            )
        rows = _csv_rows(path) if path.exists() else []
        done = min(len(rows), len(recs), n)
        _rewrite(path, side, header, old_meta, rows[:done], recs[:done])
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _rewrite(path, side, header, meta, [], [])
    with progress_enabled(progress):
        bar = progress_bar(n, initial=done, desc="latency", unit="model", leave=True)
    try:
        with open(path, "a") as fc, open(side, "a") as fs:
            for i in range(done, n):
                record, features = draw(i)
                values = measure(i, record)
                fs.write(json.dumps({"index": i, **record, "values": values}) + "\n")
                fs.flush()
                fc.write(",".join(_fmt(v) for v in (*features, *values)) + "\n")
                fc.flush()
                bar.update(1)
                if total is not None:
                    bar.set_postfix(ms=f"{total(values):.2f}", refresh=False)
    finally:
        bar.close()


def _fmt(v: float) -> str:
    return repr(float(v)) if not math.isclose(v, round(v)) else str(int(round(v)))


def _rewrite(
    path: Path, side: Path, header: list[str], meta: dict, rows: list[str], recs: list[dict]
) -> None:
    from ..checkpoint import atomic_write_bytes

    head = ",".join(header)
    atomic_write_bytes(path, "".join(line + "\n" for line in [head, *rows]).encode())
    lines = [json.dumps(meta)] + [json.dumps(r) for r in recs]
    atomic_write_bytes(side, "".join(line + "\n" for line in lines).encode())
