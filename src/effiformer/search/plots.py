"""The search's two figures (matplotlib, Agg): predicted against measured latency (HAT fig. 7),
and the loss-or-BLEU against latency frontier of a search (HAT fig. 5/6 style)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_frontier", "plot_predicted_vs_measured"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_predicted_vs_measured(
    measured: Sequence[float],
    predicted: Sequence[float],
    path: str | os.PathLike,
    *,
    title: str = "latency predictor (test split)",
    baselines: Mapping[str, Sequence[float]] | None = None,
    unit: str = "ms",
) -> Path:
    """Scatter of predicted against measured latency with the y = x line; ``baselines``: other
    predictions of the same rows (drawn fainter). Returns the path."""
    plt = _plt()
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    rmse = float(np.sqrt(np.mean((m - p) ** 2)))
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    for name, b in (baselines or {}).items():
        b = np.asarray(b, float)
        r = float(np.sqrt(np.mean((m - b) ** 2)))
        ax.scatter(m, b, s=8, alpha=0.35, label=f"{name} (RMSE {r:.3g} {unit})")
    ax.scatter(m, p, s=10, alpha=0.8, label=f"MLP (RMSE {rmse:.3g} {unit})")
    lo, hi = float(min(m.min(), p.min())), float(max(m.max(), p.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlabel(f"measured latency ({unit})")
    ax.set_ylabel(f"predicted latency ({unit})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_frontier(
    series: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    xlabel: str = "predicted latency (ms)",
    ylabel: str = "validation loss (inherited weights)",
    title: str = "evolutionary search",
    limits: Sequence[float] = (),
) -> Path:
    """One scatter per series ``{"label", "x": [...], "y": [...], "style": "o"|"*"|"-o",
    "size"}`` (e.g. every candidate a search scored, its best per limit, trained models), with
    vertical lines at the latency ``limits``. Returns the path."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for s in series:
        style = s.get("style", "o")
        x, y = np.asarray(s["x"], float), np.asarray(s["y"], float)
        if style.startswith("-"):
            order = np.argsort(x)
            ax.plot(x[order], y[order], style, label=s.get("label"), ms=s.get("size", 6))
        else:
            ax.scatter(x, y, marker=style, s=s.get("size", 12), alpha=s.get("alpha", 0.8),
                       label=s.get("label"))  # fmt: skip
    for lim in limits:
        ax.axvline(lim, color="grey", ls=":", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
