"""The text table and the log-log plot of ``effiformer bench`` results (records as written to
``results.jsonl``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .references import list_references, missing_requirements

__all__ = ["row_labels", "baselines", "format_table", "format_references", "plot_results"]

Record = dict[str, Any]


def row_labels(records: Sequence[Record]) -> list[str]:
    """A display label per record: its ``name``, or ``name@target`` when the same reference
    name stands beside several models."""
    targets: dict[str, set[str]] = {}
    for r in records:
        targets.setdefault(r["name"], set()).add(r["target"])
    return [
        r["name"] if len(targets[r["name"]]) == 1 else f"{r['name']}@{r['target']}" for r in records
    ]


def baselines(records: Sequence[Record]) -> list[int | None]:
    """Index of each record's baseline: within the same part, length, batch and target, the row
    of a baseline reference (``sdpa``) when it ran, else the first row that ran."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault((r["part"], r["seq_len"], r["batch"], r["target"]), []).append(i)
    out: list[int | None] = [None] * len(records)
    for idx in groups.values():
        ok = [i for i in idx if records[i]["status"] == "ok"]
        flagged = [i for i in ok if records[i].get("baseline")]
        base = flagged[0] if flagged else (ok[0] if ok else None)
        for i in idx:
            out[i] = base
    return out


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(v: float | None, base: float | None) -> str:
    if v is None or base is None or base <= 0:
        return "-"
    return f"{v / base:.2f}"


def format_references() -> str:
    """One line per registered reference: name, target, parts, availability, description."""
    lines = []
    for r in list_references():
        missing = missing_requirements(r)
        avail = "available" if not missing else f"needs {', '.join(missing)}"
        lines.append(
            f"{r.name:<14} beside {r.target:<12} parts={','.join(r.parts):<16} {avail:<12} "
            f"{r.description}".rstrip()
        )
    return "\n".join(lines)


def format_table(records: Sequence[Record]) -> str:
    """Plain aligned table: one row per cell, grouped by part and length; ``x`` columns are ratios
    against the row's baseline (see :func:`baselines`)."""
    if not records:
        return "(no cells)"
    labels = row_labels(records)
    base = baselines(records)
    part_order = {p: i for i, p in enumerate(dict.fromkeys(r["part"] for r in records))}
    order = sorted(
        range(len(records)),
        key=lambda i: (
            part_order[records[i]["part"]],
            records[i]["seq_len"],
            records[i]["batch"],
            i,
        ),
    )
    header = [
        "part", "name", "T", "B", "fwd ms", "x", "fwd+bwd ms", "x", "peak MiB", "x",
        "GFLOP f+b", "MFU %", "params", "note",
    ]  # fmt: skip
    rows = [header]
    for i in order:
        r = records[i]
        b = records[base[i]] if base[i] is not None else None
        ok = r["status"] == "ok"
        mfu = r.get("mfu")
        rows.append([
            r["part"], labels[i], str(r["seq_len"]), str(r["batch"]),
            _num(r.get("fwd_ms"), ".2f"), _ratio(r.get("fwd_ms"), b and b.get("fwd_ms")),
            _num(r.get("fwd_bwd_ms"), ".2f"),
            _ratio(r.get("fwd_bwd_ms"), b and b.get("fwd_bwd_ms")),
            _num(r.get("peak_mib"), ".1f"), _ratio(r.get("peak_mib"), b and b.get("peak_mib")),
            _num(None if r.get("flops_fwd_bwd") is None else r["flops_fwd_bwd"] / 1e9, ".2f"),
            _num(None if mfu is None else 100 * mfu, ".1f"),
            "-" if r.get("params") is None else f"{r['params']:,}",
            "" if ok else f"skipped: {r.get('reason', '')}",
        ])  # fmt: skip
    numeric = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
    widths = [max(len(row[c]) for row in rows) for c in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [
            row[c].rjust(widths[c]) if c in numeric else row[c].ljust(widths[c])
            for c in range(len(header) - 1)
        ]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    lines.insert(1, "-" * max(len(line) for line in lines))
    lines.append(
        "x: ratio to the baseline of the same part, length and model (sdpa when it ran, else the "
        "first row).\nMFU: fwd+bwd FLOPs / time / measured matmul peak; causal attention is "
        "counted in full (T x T, as PyTorch's FlopCounterMode and PaLM-style MFU count it), so a "
        "causal kernel that skips masked blocks can exceed 100%."
    )
    return "\n".join(lines)


def plot_results(records: Sequence[Record], path: str | os.PathLike) -> bool:
    """Draw forward+backward time (solid; forward dashed) and peak memory against length, log-log,
    one line per row label and part, into ``path`` (PNG, matplotlib Agg). Returns False when no
    cell ran (no file is written)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = row_labels(records)
    series: dict[str, list[Record]] = {}
    parts = {r["part"] for r in records}
    for lab, r in zip(labels, records):
        if r["status"] != "ok":
            continue
        key = lab if len(parts) == 1 else f"{lab} ({r['part']})"
        if len({x["batch"] for x in records}) > 1:
            key += f" B={r['batch']}"
        series.setdefault(key, []).append(r)
    if not series:
        return False
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, (key, recs) in enumerate(series.items()):
        recs = sorted(recs, key=lambda r: r["seq_len"])
        xs = [r["seq_len"] for r in recs]
        color = f"C{i % 10}"
        ax_t.plot(xs, [r["fwd_bwd_ms"] for r in recs], "o-", color=color, label=key)
        ax_t.plot(xs, [r["fwd_ms"] for r in recs], "x--", color=color, alpha=0.6)
        mem = [(x, r["peak_mib"]) for x, r in zip(xs, recs) if (r["peak_mib"] or 0) > 0]
        if mem:
            ax_m.plot(*zip(*mem), "o-", color=color, label=key)
    env = records[0].get("env", {})
    device = f"{env.get('device_name', '')}, {env.get('threads')} threads, {env.get('dtype')}"
    ax_t.set_title("time (solid: fwd+bwd, dashed: fwd)")
    ax_t.set_ylabel("ms (median)")
    ax_m.set_title("peak memory of one fwd+bwd step")
    ax_m.set_ylabel("MiB above resident")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"effiformer bench — {device}".strip(" —"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
