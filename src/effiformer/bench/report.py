"""The text table and the log-log plot of ``effiformer bench`` results (records as written to
``results.jsonl``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..flops import format_mult_adds
from .references import list_references, missing_requirements

#: A cell whose timing samples spread more than this ((max - min) / median) is flagged noisy.
NOISY_SPREAD = 0.2

__all__ = [
    "row_labels",
    "baselines",
    "format_table",
    "format_references",
    "format_summary",
    "plot_results",
]

Record = dict[str, Any]


def row_labels(records: Sequence[Record]) -> list[str]:
    """A display label per record: a model row's ``name``; a reference row's ``name``, or
    ``name@target`` for every reference row when the table holds several models (so each
    reference row says which model it stands beside, whether or not its name repeats)."""
    targets = {r["target"] for r in records}
    return [
        r["name"] if r["name"] == r["target"] or len(targets) == 1 else f"{r['name']}@{r['target']}"
        for r in records
    ]


def baselines(records: Sequence[Record]) -> list[int | None]:
    """Index of each record's baseline: within the same part, length, batch and target, the row
    of a baseline reference (``sdpa``) when it ran, else the first row that ran. When a model
    row is itself the baseline (the default set's ``dense``), the groups span every target: the
    mechanisms are compared with that row."""
    across = any(r.get("baseline") and r.get("kind") == "model" for r in records)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        key = (r["part"], r["seq_len"], r["batch"]) + (() if across else (r["target"],))
        groups.setdefault(key, []).append(i)
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


def _targets(targets: list[str]) -> str:
    """``routing-*`` for targets that are exactly the registered names of that glob."""
    if len(targets) > 2:
        from ..registry import list_models

        prefix = os.path.commonprefix(targets)
        prefix = prefix[: prefix.rfind("-") + 1]
        if prefix and sorted(list_models(prefix + "*")) == sorted(targets):
            return prefix + "*"
    return ", ".join(targets)


def format_references() -> str:
    """One line per registered reference (references registered under one name for several
    targets share a line): name, targets, parts, availability, description."""
    groups: dict[tuple, list[str]] = {}
    for r in list_references():
        missing = missing_requirements(r)
        avail = "available" if not missing else f"needs {', '.join(missing)}"
        groups.setdefault((r.name, r.parts, avail, r.description), []).append(r.target)
    rows = [
        (name, _targets(targets), ",".join(parts), avail, desc)
        for (name, parts, avail, desc), targets in groups.items()
    ]
    w = [max(len(row[i]) for row in rows) for i in range(4)] if rows else [0] * 4
    return "\n".join(
        f"{n:<{w[0]}}  beside {t:<{w[1]}}  parts={p:<{w[2]}}  {a:<{w[3]}}  {d}".rstrip()
        for n, t, p, a, d in rows
    )


def _note(r: Record) -> str:
    if r["status"] != "ok":
        return f"skipped: {r.get('reason', '')}"
    if not r.get("noisy"):
        return ""
    keys = ("total_spread",) if r["part"] == "decoding" else ("fwd_spread", "fwd_bwd_spread")
    worst = max((r.get(k) or 0.0) for k in keys)
    return f"noisy: samples spread {100 * worst:.0f}% (> {100 * NOISY_SPREAD:.0f}%)"


def _align(rows: list[list[str]], numeric: set[int]) -> list[str]:
    n = len(rows[0]) - 1  # the last column (note) is free text
    widths = [max(len(row[c]) for row in rows) for c in range(n)]
    lines = []
    for row in rows:
        cells = [
            row[c].rjust(widths[c]) if c in numeric else row[c].ljust(widths[c]) for c in range(n)
        ]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    lines.insert(1, "-" * max(len(line) for line in lines))
    return lines


def _order(records: Sequence[Record], idx: list[int]) -> list[int]:
    part_order = {p: i for i, p in enumerate(dict.fromkeys(records[i]["part"] for i in idx))}
    return sorted(
        idx,
        key=lambda i: (
            part_order[records[i]["part"]],
            records[i]["seq_len"],
            records[i]["batch"],
            i,
        ),
    )


def format_table(records: Sequence[Record]) -> str:
    """Plain aligned table: one row per cell, grouped by part and length; ``x`` columns are ratios
    against the row's baseline (see :func:`baselines`). Decoding cells (``--part decoding``)
    get a table of their own (encoder, decoder and total ms per sentence)."""
    if not records:
        return "(no cells)"
    labels = row_labels(records)
    base = baselines(records)
    training = [i for i, r in enumerate(records) if r["part"] != "decoding"]
    decoding = [i for i, r in enumerate(records) if r["part"] == "decoding"]
    out: list[str] = []
    if training:
        madds = any(records[i].get("mult_adds") is not None for i in training)
        header = [
            "part", "name", "T", "B", "fwd ms", "x", "fwd+bwd ms", "x", "peak MiB", "x",
            "GFLOP f+b", "MFU %", "params", *(["Mult-Adds"] if madds else []), "note",
        ]  # fmt: skip
        rows = [header]
        for i in _order(records, training):
            r = records[i]
            b = records[base[i]] if base[i] is not None else None
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
                *([format_mult_adds(r.get("mult_adds"))] if madds else []),
                _note(r),
            ])  # fmt: skip
        out += _align(rows, set(range(2, 14 if madds else 13)))
        across = next(
            (
                records[i]["name"]
                for i in training
                if records[i].get("baseline") and records[i].get("kind") == "model"
            ),
            None,
        )
        what = (
            f"x: ratio to the {across} row of the same part and length."
            if across
            else "x: ratio to the baseline of the same part, length and model (sdpa when it ran, "
            "else the first row)."
        )
        out.append(
            what + "\nMFU: fwd+bwd FLOPs / time / the machine's peak (the fastest square "
            "matmul measured at the start, or the fastest cell when one beat it); a causal SDPA "
            "call is counted as the (query, key) pairs it computes (about half of T x T)."
        )
    if decoding:
        if out:
            out.append("")
        header = [
            "part", "name", "src", "beam", "steps", "encoder ms", "decoder ms", "total ms", "x",
            "GFLOP", "params", "Mult-Adds", "note",
        ]  # fmt: skip
        rows = [header]
        for i in _order(records, decoding):
            r = records[i]
            b = records[base[i]] if base[i] is not None else None
            flops = r.get("flops_decoding")
            rows.append([
                r["part"], labels[i], str(r["seq_len"]), _num(r.get("beam"), "d"),
                _num(r.get("steps"), "d"), _num(r.get("encoder_ms"), ".2f"),
                _num(r.get("decoder_ms"), ".2f"), _num(r.get("total_ms"), ".2f"),
                _ratio(r.get("total_ms"), b and b.get("total_ms")),
                _num(None if flops is None else flops / 1e9, ".3f"),
                "-" if r.get("params") is None else f"{r['params']:,}",
                format_mult_adds(r.get("mult_adds")),
                _note(r),
            ])  # fmt: skip
        out += _align(rows, set(range(2, 12)))
        out.append(
            "decoding: one sentence of `src` tokens, batch 1, beam search for exactly `steps` "
            "decoder steps, ms per sentence (10-90 % trimmed mean of the timed runs, HAT's "
            "measurement); x: ratio to the first row of the same length and model; GFLOP: one "
            "whole translation, all beams (FlopCounterMode); Mult-Adds: the analytic count of one "
            "teacher-forced pass over src source and steps target tokens (effiformer.flops, "
            "the papers' convention)."
        )
    return "\n".join(out)


def plot_results(records: Sequence[Record], path: str | os.PathLike) -> bool:
    """Draw forward+backward time (solid; forward dashed) and peak memory against length, log-log,
    one line per row label and part, into ``path`` (PNG, matplotlib Agg). Decoding cells are
    not drawn (the table has them). Returns False when no cell is drawn (no file is written)."""
    records = [r for r in records if r.get("part") != "decoding"]
    if not any(r["status"] == "ok" for r in records):
        return False
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


def format_summary(records: Sequence[Record], baseline: str = "dense") -> str:
    """A few lines a newcomer can read: for each part and length where a model row is labelled
    ``baseline``, the fastest row (forward+backward time, else forward), the one needing least
    memory, and every row's time and memory as a ratio to the baseline's. Empty when no group has
    the baseline row."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        if r.get("kind") == "model" and r.get("status") == "ok":
            groups.setdefault((r["part"], r["seq_len"]), []).append(r)
    lines: list[str] = []
    for (part, length), rows in groups.items():
        base = next((r for r in rows if r["name"] == baseline), None)
        if base is None or len(rows) < 2:
            continue
        key = "fwd_bwd_ms" if base.get("fwd_bwd_ms") is not None else "fwd_ms"
        timed = [r for r in rows if r.get(key) is not None]
        what = "forward+backward" if key == "fwd_bwd_ms" else "forward"
        scope = "one attention layer" if part == "attention" else "the whole model"
        lines.append(f"{scope} at {length:,} tokens ({what}):")
        if timed and base.get(key):
            fast = min(timed, key=lambda r: r[key])
            lines.append(
                f"  fastest: {fast['name']} ({fast[key]:.1f} ms, "
                f"{fast[key] / base[key]:.2f}x {baseline})"
            )
        mem = [r for r in rows if r.get("peak_mib") is not None]
        if mem and base.get("peak_mib"):
            small = min(mem, key=lambda r: r["peak_mib"])
            lines.append(
                f"  least memory: {small['name']} ({small['peak_mib']:.0f} MiB, "
                f"{small['peak_mib'] / base['peak_mib']:.2f}x {baseline})"
            )
        ratios = []
        for r in rows:
            if r is base:
                continue
            t = f"{r[key] / base[key]:.2f}x time" if r.get(key) and base.get(key) else "time ?"
            m = (
                f"{r['peak_mib'] / base['peak_mib']:.2f}x memory"
                if r.get("peak_mib") and base.get("peak_mib")
                else "memory ?"
            )
            ratios.append(f"{r['name']} {t}, {m}")
        if ratios:
            lines.append(f"  against {baseline}: " + "; ".join(ratios))
    return "\n".join(lines)
