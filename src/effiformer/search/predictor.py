"""HAT's latency predictor and the baselines it should beat (HAT sec. 3.2, official
``latency_predictor.py`` and ``configs/*/latency_predictor/*.yml``).

- :class:`LatencyPredictor`: an MLP ``F -> 400 -> 400 -> 400 -> 400 -> 1`` with ReLU (a first
  layer, ``hidden_layers=3`` hidden ones, an output layer: five linear layers; the paper's "3
  layers" counts the hidden ones), on features divided by ``feature_norm`` (HAT's
  ``[640, 6, 2048, 6, 640, 6, 2048, 6, 6, 2]``) predicting latency divided by ``lat_norm`` (HAT:
  300 ms on the Xeon, 200 on the TITAN Xp, 5000 on the Raspberry Pi). Trained with MSE and Adam
  (lr 1e-5), batches of 128 rows drawn without replacement, 5000 steps
  (:func:`train_predictor`).
- :func:`split_indices`: a seeded shuffle, then 8:1:1 train / valid / test (HAT shuffles with the
  unseeded global RNG).
- :class:`LinearFit`: least squares with an intercept, on the ten features or on one Mult-Adds
  column (:func:`hat_proxies`: HAT's Mult-Adds count, the README's FLOPs / 2; and the Mult-Adds
  of the measured decoding workload).
- :func:`compare_predictors`: all of them on the same split: test RMSE (ms) and mean absolute
  percentage error (%).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MIN_ROWS",
    "LatencyPredictor",
    "LinearFit",
    "PredictorReport",
    "compare_predictors",
    "errors",
    "hat_proxies",
    "load_predictor",
    "save_predictor",
    "split_indices",
    "train_predictor",
]


class LatencyPredictor(nn.Module):
    """features (N, F) in their own units -> latency (N,) in ms (see the module docstring)."""

    def __init__(
        self,
        feature_norm: Sequence[float],
        lat_norm: float,
        *,
        hidden: int = 400,
        hidden_layers: int = 3,
        feature_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        norm = torch.tensor([float(v) for v in feature_norm], dtype=torch.float32)
        if norm.dim() != 1 or not bool((norm > 0).all()):
            raise ValueError(f"feature_norm must be positive numbers, got {list(feature_norm)}")
        if not lat_norm > 0:
            raise ValueError(f"lat_norm must be positive, got {lat_norm}")
        self.register_buffer("feature_norm", norm)
        self.lat_norm = float(lat_norm)
        self.hidden, self.hidden_layers = hidden, hidden_layers
        self.feature_names = tuple(feature_names) if feature_names is not None else None
        n = norm.numel()
        self.first = nn.Linear(n, hidden)
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(hidden_layers))
        self.out = nn.Linear(hidden, 1)

    @property
    def n_features(self) -> int:
        return self.feature_norm.numel()

    def forward_normalised(self, x: Tensor) -> Tensor:
        """x: (N, F) normalised features -> (N,) normalised latency."""
        h = F.relu(self.first(x))
        for layer in self.layers:
            h = F.relu(layer(h))
        return self.out(h).squeeze(-1)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() != 2 or features.shape[1] != self.n_features:
            raise ValueError(
                f"features must be (N, {self.n_features}), got {tuple(features.shape)}"
            )
        x = features.to(self.feature_norm.dtype) / self.feature_norm
        return self.forward_normalised(x) * self.lat_norm

    @torch.no_grad()
    def predict(self, features: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
        """Latency (ms) of each feature row."""
        x = torch.as_tensor(np.asarray(features, dtype=np.float32))
        if x.dim() == 1:
            x = x[None]
        was = self.training
        self.eval()
        try:
            return self(x).double().numpy()
        finally:
            self.train(was)


#: the fewest rows the 8:1:1 split (and so the ``predictor`` step) takes
MIN_ROWS = 10


def split_indices(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeded permutation of ``range(n)`` cut 8:1:1 (train and valid take ``floor`` of 80 %
    and 10 %, test the rest, as the official ``split``)."""
    if n < MIN_ROWS:
        raise ValueError(f"need at least {MIN_ROWS} rows to split 8:1:1, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(math.floor(0.8 * n)), int(math.floor(0.1 * n))
    return order[:a], order[a : a + b], order[a + b :]


def errors(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """``rmse`` (the target's unit) and ``mape`` (mean absolute percentage error, %)."""
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    return {
        "rmse": float(np.sqrt(np.mean((pred - true) ** 2))),
        "mape": float(np.mean(np.abs(pred - true) / np.abs(true)) * 100.0),
    }


def train_predictor(
    x_train: np.ndarray,
    y_train: np.ndarray,
    *,
    feature_norm: Sequence[float],
    lat_norm: float,
    steps: int = 5000,
    batch: int = 128,
    lr: float = 1e-5,
    seed: int = 0,
    hidden: int = 400,
    hidden_layers: int = 3,
    valid: tuple[np.ndarray, np.ndarray] | None = None,
    log_every: int = 100,
    feature_names: Sequence[str] | None = None,
    threads: int | None = 1,
) -> tuple[LatencyPredictor, list[dict[str, float]]]:
    """HAT's training: MSE on normalised latency, Adam (``lr``), ``steps`` batches of
    ``batch`` rows drawn without replacement (fewer when the split is smaller). Returns the
    predictor and a history of ``{"step", "train_mse", "valid_rmse"}`` every ``log_every``.
    ``threads``: torch intra-op threads while training (1: a 400-wide MLP gains nothing from
    more, and on a busy machine more threads are many times slower; None: as they are)."""
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train_predictor(
            x_train, y_train, feature_norm, lat_norm, steps, batch, lr, seed, hidden,
            hidden_layers, valid, log_every, feature_names,
        )  # fmt: skip
    finally:
        torch.set_num_threads(old)


def _train_predictor(
    x_train, y_train, feature_norm, lat_norm, steps, batch, lr, seed, hidden, hidden_layers,
    valid, log_every, feature_names,
) -> tuple[LatencyPredictor, list[dict[str, float]]]:  # fmt: skip
    x = torch.as_tensor(np.asarray(x_train, dtype=np.float32))
    y = torch.as_tensor(np.asarray(y_train, dtype=np.float32))
    if x.dim() != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"x_train must be (N, F) and y_train (N,), got {x.shape}, {y.shape}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LatencyPredictor(
            feature_norm,
            lat_norm,
            hidden=hidden,
            hidden_layers=hidden_layers,
            feature_names=feature_names,
        )
    xn, yn = x / model.feature_norm, y / model.lat_norm
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    k = min(batch, len(x))
    history = []
    model.train()
    for step in range(steps):
        idx = torch.randperm(len(x), generator=g)[:k]
        loss = F.mse_loss(model.forward_normalised(xn[idx]), yn[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            rec = {"step": step, "train_mse": float(loss.detach())}
            if valid is not None:
                rec["valid_rmse"] = errors(model.predict(valid[0]), valid[1])["rmse"]
            history.append(rec)
    model.eval()
    return model, history


@dataclass
class LinearFit:
    """Least squares ``y = X w + b`` (numpy ``lstsq``)."""

    coef: np.ndarray
    intercept: float

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> LinearFit:
        x = np.asarray(x, dtype=np.float64)
        x = x[:, None] if x.ndim == 1 else x
        a = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        sol, *_ = np.linalg.lstsq(a, np.asarray(y, dtype=np.float64), rcond=None)
        return cls(sol[:-1], float(sol[-1]))

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        x = x[:, None] if x.ndim == 1 else x
        return x @ self.coef + self.intercept


@dataclass
class PredictorReport:
    """Test-split errors of the MLP and the two linear baselines, the split sizes and the
    models (``mlp``: the predictor; ``test_pred``: its predictions on the test rows)."""

    results: dict[str, dict[str, float]]
    sizes: tuple[int, int, int]
    mlp: LatencyPredictor
    test_index: np.ndarray
    test_pred: np.ndarray
    history: list[dict[str, float]]
    test_true: np.ndarray | None = None
    baseline_pred: dict[str, np.ndarray] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.results, "split": list(self.sizes)}


def compare_predictors(
    features: np.ndarray,
    latency_ms: np.ndarray,
    proxies: Mapping[str, np.ndarray],
    *,
    feature_norm: Sequence[float],
    lat_norm: float,
    seed: int = 0,
    steps: int = 5000,
    batch: int = 128,
    lr: float = 1e-5,
    hidden: int = 400,
    hidden_layers: int = 3,
    feature_names: Sequence[str] | None = None,
) -> PredictorReport:
    """The MLP, a linear fit on the features, a linear fit on each of ``proxies`` (name -> one
    value per row, e.g. ``{"macs": ..., "decoding_macs": ...}``: results ``"macs_linear"``,
    ...) and a linear fit on the features with each proxy as an eleventh column (results
    ``"features_macs_linear"``, ...: a linear model that also sees the work, which the
    features reach only through products such as layers x width), all trained on the same
    seeded 8:1:1 split's training rows; errors on its test rows."""
    features = np.asarray(features, dtype=np.float64)
    y = np.asarray(latency_ms, dtype=np.float64)
    tr, va, te = split_indices(len(y), seed)
    mlp, history = train_predictor(
        features[tr],
        y[tr],
        feature_norm=feature_norm,
        lat_norm=lat_norm,
        steps=steps,
        batch=batch,
        lr=lr,
        seed=seed,
        hidden=hidden,
        hidden_layers=hidden_layers,
        valid=(features[va], y[va]),
        log_every=max(steps // 20, 1),
        feature_names=feature_names,
    )
    pred = mlp.predict(features[te])
    base = {"features_linear": LinearFit.fit(features[tr], y[tr]).predict(features[te])}
    for name, values in proxies.items():
        v = np.asarray(values, dtype=np.float64)
        if v.shape != y.shape:
            raise ValueError(f"proxy {name!r} needs one value per row ({len(y)}), got {v.shape}")
        base[f"{name}_linear"] = LinearFit.fit(v[tr], y[tr]).predict(v[te])
        both = np.concatenate([features, v[:, None]], axis=1)
        base[f"features_{name}_linear"] = LinearFit.fit(both[tr], y[tr]).predict(both[te])
    results = {"mlp": errors(pred, y[te])}
    results.update({k: errors(b, y[te]) for k, b in base.items()})
    return PredictorReport(
        results, (len(tr), len(va), len(te)), mlp, te, pred, history, y[te], base
    )


def hat_proxies(
    features: np.ndarray, qkv_dim: int = 512, *, src_len: int = 30, beam: int = 5
) -> dict[str, np.ndarray]:
    """The Mult-Adds proxies of rows of HAT's ten features: ``macs`` (HAT's count, the README's
    FLOPs / 2, :func:`~effiformer.search.macs.features_macs`) and ``decoding_macs`` (the measured
    decoding workload, :func:`~effiformer.search.macs.features_decoding_macs`)."""
    from .macs import features_decoding_macs, features_macs

    f = np.asarray(features, dtype=np.float64)
    return {
        "macs": np.array([features_macs(r, qkv_dim, src_len=src_len) for r in f]),
        "decoding_macs": np.array(
            [features_decoding_macs(r, qkv_dim, src_len=src_len, beam=beam) for r in f]
        ),
    }


def save_predictor(model: LatencyPredictor, path: str | os.PathLike, **meta: Any) -> Path:
    """Weights, norms and ``meta`` (JSON-able: the device, the dataset, its errors) in one
    ``torch.save`` file, written atomically."""
    import io

    from ..checkpoint import atomic_write_bytes

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(
        {
            "format": "effiformer-latency-predictor-v1",
            "state": {k: v for k, v in model.state_dict().items()},
            "feature_norm": model.feature_norm.tolist(),
            "lat_norm": model.lat_norm,
            "hidden": model.hidden,
            "hidden_layers": model.hidden_layers,
            "feature_names": list(model.feature_names) if model.feature_names else None,
            "meta": meta,
        },
        buf,
    )
    atomic_write_bytes(path, buf.getvalue())
    return path


def load_predictor(path: str | os.PathLike) -> tuple[LatencyPredictor, dict[str, Any]]:
    """(predictor in eval mode, its meta) from :func:`save_predictor`'s file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no latency predictor at {str(path)!r}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob.get("format") != "effiformer-latency-predictor-v1":
        raise ValueError(f"{path} is not an effiformer latency predictor")
    model = LatencyPredictor(
        blob["feature_norm"],
        blob["lat_norm"],
        hidden=blob["hidden"],
        hidden_layers=blob["hidden_layers"],
        feature_names=blob["feature_names"],
    )
    model.load_state_dict(blob["state"])
    return model.eval(), blob["meta"]
