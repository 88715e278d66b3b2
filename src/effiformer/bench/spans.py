"""The spans an Adaptive Attention Span model learned, read off its layers: one row per layer and
head (:func:`span_report`), as text (:func:`format_span_report`) and as a plot
(:func:`plot_span_report`): the paper's fig. 3/4 (spans per head and layer). Reporting, not the
mechanism (:mod:`effiformer.attention.adaptive_span`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from ..attention.adaptive_span import AdaptiveSpanAttention

__all__ = ["format_span_report", "plot_span_report", "span_report"]


def _span_modules(model: nn.Module) -> Iterable[tuple[str, AdaptiveSpanAttention]]:
    for name, m in model.named_modules():
        if isinstance(m, AdaptiveSpanAttention):
            yield name, m


def span_report(model: nn.Module) -> list[dict[str, Any]]:
    """One row per adaptive-span layer and head: ``module`` (its name in the model), ``layer``,
        ``head``, ``p``, ``span`` (z = p S), ``reach`` (the distance at which the mask reaches 0,
    min(S, z + R): keys closer than it have a non-zero weight, the key at distance z + R has weight
    exactly 0, so at z = 0 the R - 1 nearest keys carry weight),
        ``max_span`` (S), ``window`` (the layer's trimmed window) and ``memory`` (past states the
        layer's FIFO memory keeps at the configured S, i.e. ``memory_len(S)``)."""
    rows = []
    for name, m in _span_modules(model):
        c = m.config
        window, memory = m.window(), m.memory_len(c.max_span)
        for head, p in enumerate(m.current_val.detach().cpu().tolist()):
            z = p * c.max_span
            rows.append(
                {
                    "module": name,
                    "layer": m.dims.layer,
                    "head": head,
                    "p": p,
                    "span": z,
                    "reach": min(float(c.max_span), z + c.ramp),
                    "max_span": c.max_span,
                    "window": window,
                    "memory": memory,
                }
            )
    return rows


def format_span_report(rows: list[dict[str, Any]]) -> str:
    """A plain aligned table of :func:`span_report` rows, with each layer's mean span."""
    if not rows:
        return "(no adaptive-span layers)"
    lines = [f"{'layer':>5} {'head':>4} {'p':>8} {'span':>9} {'reach':>9} {'window':>7}"]
    for r in rows:
        lines.append(
            f"{r['layer']:>5} {r['head']:>4} {r['p']:>8.4f} {r['span']:>9.1f} "
            f"{r['reach']:>9.1f} {r['window']:>7}"
        )
    layers = sorted({r["layer"] for r in rows})
    means = []
    for layer in layers:
        spans = [r["span"] for r in rows if r["layer"] == layer]
        means.append(f"layer {layer}: {sum(spans) / len(spans):.1f}")
    lines.append("mean span per layer: " + ", ".join(means))
    return "\n".join(lines)


def plot_span_report(
    rows: list[dict[str, Any]], path: str, *, title: str = "learned attention spans"
) -> str:
    """Draw the learned span (z = p S) of every head, grouped by layer, as a PNG at ``path``
    (bars, log scale, with S and R marked, in the manner of the paper's figure 3). Returns
    ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("no adaptive-span layers to plot")
    layers = sorted({r["layer"] for r in rows})
    heads = sorted({r["head"] for r in rows})
    width = 0.8 / len(heads)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(layers) * len(heads) ** 0.5 + 2), 3.2))
    for hi, head in enumerate(heads):
        xs, ys = [], []
        for li, layer in enumerate(layers):
            for r in rows:
                if r["layer"] == layer and r["head"] == head:
                    xs.append(li + (hi - (len(heads) - 1) / 2) * width)
                    ys.append(max(r["span"], 0.5))
        ax.bar(xs, ys, width=width, label=f"head {head}")
    s = max(r["max_span"] for r in rows)
    ax.axhline(s, color="k", lw=0.8, ls="--", label=f"S = {s}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(layers)), [str(li) for li in layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("span z = p S (tokens)")
    ax.set_title(title)
    if len(heads) <= 16:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
