"""The learned attention spans of an Adaptive-Span model: per layer and head, as a table, JSON
lines and a PNG (``effiformer.bench.spans.span_report`` / ``plot_span_report``).

    python benchmarks/adaptive_span_report.py RUN_OR_CHECKPOINT [--out DIR]
    python benchmarks/adaptive_span_report.py --model adaptive-span-small   # untrained spans

``RUN_OR_CHECKPOINT``: a training run directory (``effiformer train --out``: its ``latest``
checkpoint), one checkpoint directory, or a ``save_model`` directory. Writes
``OUT/spans.jsonl`` (the environment, then one record per head: layer, head, p, span z = p S,
reach min(S, z + R), the layer's trimmed window and cache length), ``OUT/spans.txt`` (the table
printed here) and ``OUT/spans.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from effiformer import create_model, load_model
from effiformer.bench import environment
from effiformer.bench.spans import format_span_report, plot_span_report, span_report
from effiformer.checkpoint import resolve_checkpoint


def load(source: str | None, model_name: str | None) -> tuple[torch.nn.Module, str]:
    """The model and a label for it: a registered name built fresh, or a checkpoint."""
    if model_name is not None:
        return create_model(model_name), model_name
    directory = resolve_checkpoint(source)
    return load_model(directory), str(directory)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("source", nargs="?", help="run directory, checkpoint or saved model")
    p.add_argument("--model", default=None, help="a registered name instead (untrained spans)")
    p.add_argument("--out", default="benchmarks/out/adaptive_span_report")
    args = p.parse_args(argv)
    if (args.source is None) == (args.model is None):
        p.error("give a run/checkpoint directory or --model NAME (one of the two)")
    model, label = load(args.source, args.model)
    rows = span_report(model)
    if not rows:
        print(f"{label}: no adaptive_span attention layer", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    env.update(kind="environment", command=" ".join([sys.executable, *sys.argv]), source=label)
    with open(out / "spans.jsonl", "w") as f:
        f.write(json.dumps(env) + "\n")
        for r in rows:
            f.write(json.dumps({"kind": "span", **r}) + "\n")
    table = format_span_report(rows)
    (out / "spans.txt").write_text(f"# {label}\n{table}\n")
    plot_span_report(rows, os.fspath(out / "spans.png"), title=f"learned spans: {Path(label).name}")
    print(
        f"# {label}\n{table}\nwrote {out / 'spans.jsonl'}, {out / 'spans.txt'}, {out / 'spans.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
