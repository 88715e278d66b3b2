"""Which parts of MQAR's recall circuit a trained quality cell has formed, at each length of its
training ladder: the attention weights of its layers on test sequences, read where the circuit
needs them.

The question (docs/quality.md, issue 22): relative-XL stays on MQAR's "one of the values in
context" plateau at 1,024 tokens, and its learned relative position terms are what keeps it
there (its ablations); this shows *which* step of the circuit they block. A two-layer model
solves MQAR with two heads in sequence (the induction-head circuit):

1. ``previous``: in the first layer each value position attends to the key just before it,
   so the value position comes to carry its key (a previous-token head, found by position);
   ``next_key``: the weight the key after a pair puts on that pair (its two previous
   positions), the variant where the next key carries the pair and the second layer reads it
   there (``recall_next``);
2. ``recall``: in the second layer each query (a key seen again) attends to the value position
   that carries its key, and copies the value (found by content); ``recall_next`` is the weight
   on the position after the value (the next key), which the ``next_key`` variant reads, as do
   the adaptive span models whose queries do not see their own position.

Also per layer: ``values``, a query's total weight on all the value positions of the pairs (the
plateau's "one of the values in context" reads them all alike), and ``recent``, its weight on
the 8 positions up to itself. Each figure is the mean over the test rows' queries (``previous``:
over the value positions), for the head where it is largest, with that head.

    python benchmarks/mqar_circuit.py --out benchmarks/results/quality_cpu_mqar \\
        --cells mqar/relative-xl/T1024/lr0.001/s0 mqar/dense/T1024/lr0.001/s0

Parts with explicit attention weights only: dense (``DenseAttention``, causal softmax computed
here; also LSRA's attention branch, whose convolution branch is not read), relative-XL and
adaptive span (their ``attention_probs``); another part is refused. Reads
each cell's record in ``OUT/results.jsonl`` and its last checkpoint in ``OUT/cells/``; writes
``OUT/circuit.jsonl`` (one row per cell, length and layer) and ``OUT/circuit.md``; rows of cells
not named keep what they held.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from effiformer.attention import AttentionMask
from effiformer.attention.adaptive_span import AdaptiveSpanAttention
from effiformer.attention.dense import DenseAttention
from effiformer.attention.relative_xl import RelativeXLAttention
from effiformer.bench.quality import BUDGETS, _make_cell, module_inputs, recorded_cells
from effiformer.checkpoint import load_checkpoint
from effiformer.tasks.mqar import MQARTask, length_ladder, mqar_recall_positions

NAME = "mqar_circuit.py"
PARTS = (DenseAttention, RelativeXLAttention, AdaptiveSpanAttention)
RECENT = 8


@torch.no_grad()
def layer_probs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The causal attention weights of every attention layer of ``model`` on ``x`` (B, T), in
    the order the model calls them: (B, H, T, T) each."""
    layers = [m for m in model.modules() if isinstance(m, PARTS)]
    seen = [(m, h, kw.get("positions")) for m, h, kw in module_inputs(model, x, layers)]
    out = []
    causal = AttentionMask(causal=True)
    for m, h, pos in seen:
        if isinstance(m, DenseAttention):
            q, k = m._heads(m.q_proj(h)), m._heads(m.k_proj(h))  # (B, H, T, Dh)
            s = (q @ k.transpose(-1, -2)) * m.head_dim**-0.5
            t = h.shape[1]
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            out.append(torch.softmax(s.float(), dim=-1))
        else:
            out.append(m.attention_probs(h, mask=causal, positions=pos).float())
    return out


def circuit(model: torch.nn.Module, task: MQARTask, sequences: int) -> list[dict]:
    """Per layer: the circuit's weights (module docstring) on ``sequences`` test rows of ``task``,
    each the largest over heads, with the head (``*_head``)."""
    x, y = task.split("test")
    x, y = x[:sequences], y[:sequences]
    n = task.n_pairs
    rows, qs, vs = [], [], []
    for row, pairs in enumerate(mqar_recall_positions(x, y, n)):
        for q, v in pairs:
            rows.append(row)
            qs.append(q)
            vs.append(v)
    rows_t, qs_t, vs_t = torch.tensor(rows), torch.tensor(qs), torch.tensor(vs)
    vals = torch.arange(1, 2 * n, 2)
    out = []
    for layer, p in enumerate(layer_probs(model, x)):  # p: (B, H, T, T)
        at_q = p[rows_t, :, qs_t]  # (Q, H, T): each query's weights
        recent = torch.stack([at_q[i, :, max(0, q - RECENT + 1) : q + 1].sum(-1)
                              for i, q in enumerate(qs)])  # fmt: skip
        nxt = vals[:-1] + 1  # the key after each value but the last
        figures = {
            "previous": p[:, :, vals, vals - 1].mean(dim=(0, 2)),
            "next_key": (p[:, :, nxt, nxt - 1] + p[:, :, nxt, nxt - 2]).mean(dim=(0, 2)),
            "recall": at_q[torch.arange(len(qs)), :, vs_t].mean(0),
            "recall_next": at_q[torch.arange(len(qs)), :, vs_t + 1].mean(0),
            "values": at_q[:, :, vals].sum(-1).mean(0),
            "recent": recent.mean(0),
        }
        row = {"layer": layer}
        for name, per_head in figures.items():
            empty = name == "next_key" and n < 2  # one pair: no key after a pair
            row[name] = None if empty else float(per_head.max())
            row[f"{name}_head"] = None if empty else int(per_head.argmax())
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="the quality run's folder")
    p.add_argument("--cells", nargs="+", required=True, help="MQAR cell ids, as in results.jsonl")
    p.add_argument("--min-len", type=int, default=64, help="the ladder's shortest length")
    p.add_argument("--sequences", type=int, default=16, help="test sequences per length")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    try:  # every cell is checked before anything is scored or written
        found = recorded_cells(out, args.cells)
    except ValueError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    todo = []
    for r, run in found:
        cid = r["cell"]
        if r["task"] != "mqar":
            print(f"{NAME}: {cid} is not an MQAR cell", file=sys.stderr)
            return 2
        try:
            lengths = list(length_ladder(args.min_len, int(r["length"])))
        except ValueError as e:
            print(f"{NAME}: {cid}: {e}", file=sys.stderr)
            return 2
        model, _ = load_checkpoint(run)
        if not any(isinstance(m, PARTS) for m in model.modules()):
            print(f"{NAME}: {cid}: {r['mechanism']} has no attention weights this script reads "
                  "(dense, LSRA's attention branch, relative-XL and adaptive span only)", file=sys.stderr)  # fmt: skip
            return 2
        todo.append((r, run, model, lengths))
    path = out / "circuit.jsonl"
    kept = []
    names = {r["cell"] for r, *_ in todo}
    if path.is_file():
        kept = [json.loads(line) for line in path.read_text().splitlines()]
        kept = [row for row in kept if row["cell"] not in names]
    new = []
    for r, run, model, lengths in todo:
        cell = _make_cell(BUDGETS[r["budget"]], "mqar", r["mechanism"], r["length"], r["lr"],
                          r["seed"], None, data=None)  # fmt: skip
        opts = {k: v for k, v in (cell.get("task_options") or {}).items() if k != "train_min_len"}
        step = (run / "latest").read_text().strip()
        for length in lengths:
            task = MQARTask(seq_len=length, batch_size=int(r["batch"]), seed=int(r["seed"]),
                            **opts)  # fmt: skip
            for layer in circuit(model, task, args.sequences):
                new.append({"cell": r["cell"], "mechanism": r["mechanism"], "checkpoint": step,
                            "record_test": r.get("test"), "length": length, **layer})  # fmt: skip
        print(r["cell"], "done", flush=True)
    rows = kept + new
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines = ["MQAR's recall circuit in trained cells: mean attention weight, best head (its "
             "number), per layer and length (benchmarks/mqar_circuit.py):", "",
             "| cell | test | T | layer | previous | next key | recall: value / next | "
             f"all values | last {RECENT} |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def fig(row: dict, name: str) -> str:
        return "-" if row[name] is None else f"{row[name]:.2f} ({row[name + '_head']})"

    for row in rows:
        test = "-" if row["record_test"] is None else f"{100 * row['record_test']:.1f}%"
        lines.append(
            f"| {row['cell']} | {test} | {row['length']} | {row['layer']} | "
            f"{fig(row, 'previous')} | {fig(row, 'next_key')} | {fig(row, 'recall')} / "
            f"{fig(row, 'recall_next')} | {fig(row, 'values')} | {fig(row, 'recent')} |"
        )
    (out / "circuit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
