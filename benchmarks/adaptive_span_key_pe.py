"""How much of an Adaptive Span layer's attention score is position and how much content, at
initialisation and after training, for quality-suite MQAR cells.

The score of query t for the key at distance d is ``q_t . (k_{t-d} + p_d) / sqrt(d_head)``
(``key_pe``, one learned vector per distance, N(0, 1) at initialisation as in the official code).
For every layer this script splits the scores of the visible (query, key) pairs of some test
sequences into the content term ``q . k / sqrt(d_head)`` and the position term
``q . p / sqrt(d_head)`` and reports the standard deviation of each over the pairs (pooled over
rows and heads), and the position term's share of their summed variance. A share near 1 means the
softmax is decided by the distance (different for every query, since q varies) rather than by
which token the key is: an MQAR recall head must find its key by content.

    python benchmarks/adaptive_span_key_pe.py --out benchmarks/results/quality_cpu_mqar_spanclip \\
        --cells mqar/adaptive-span/T64/lr0.001/s0 mqar/adaptive-span-pe0/T64/lr0.001/s0

Reads each cell's record in ``OUT/results.jsonl`` and its last checkpoint in ``OUT/cells/``
(``init``: the same config built again from the cell's seed, as the suite builds it), writes
``OUT/key_pe.jsonl`` and ``OUT/key_pe.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from effiformer.attention import AttentionMask
from effiformer.attention.adaptive_span import AdaptiveSpanAttention, SpanPositions
from effiformer.bench.quality import BUDGETS, module_inputs, recorded_cells
from effiformer.checkpoint import load_checkpoint, load_config
from effiformer.registry import build_model
from effiformer.tasks.mqar import MQARTask, mqar_recall_positions


@torch.no_grad()
def score_terms(
    model: torch.nn.Module, x: torch.Tensor, needs: list[list[tuple[int, int]]], n_pairs: int
) -> list[dict[str, float]]:
    """Per adaptive-span layer: std of the content and position terms over visible pairs, and
    the weights of the recall circuit, best head: ``previous``, the weight a value position puts
    on the key just before it; ``recall``, the weight a query puts on its pair's value, and
    ``recall_next``, on the position right after it (a model whose queries do not see their own
    position reads the value there: the next position took it in with a previous-token head).
    ``needs``: per row, (query position, value position); the value is never the last position."""
    (key_pe,) = [p for n, p in model.named_parameters() if n.endswith("key_pe")]
    layers = [m for m in model.modules() if isinstance(m, AdaptiveSpanAttention)]
    inputs = {i: h for i, (_, h, _) in enumerate(module_inputs(model, x, layers))}
    out = []
    t = x.shape[1]
    for i, m in enumerate(layers):
        c = m.config
        off = 1 if not c.include_self else 0
        h_in = inputs[i]  # (B, T, D)
        q = m._heads(m.q_proj(h_in)) * m.dims.head_dim**-0.5  # (B, H, T, Dh)
        k = m._heads(m.k_proj(h_in))
        content = q @ k.transpose(-1, -2)  # (B, H, T, T): query t, key r
        dist = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # (T, T)
        visible = (dist >= off) & (dist <= min(c.max_span, t) - 1 + off)
        col = (c.max_span - 1 - (dist - off)).clamp(0, c.max_span - 1)  # key_pe column
        pe = key_pe[0].T[col]  # (T, T, Dh)
        position = torch.einsum("bhtd,trd->bhtr", q, pe)
        cv, pv = content[..., visible], position[..., visible]
        var_c, var_p = float(cv.var()), float(pv.var())
        spans = (m.current_val.clamp(0, 1) * c.max_span).tolist()
        probs = m.attention_probs(h_in, mask=AttentionMask(causal=True),
                                  positions=SpanPositions(key_pe=key_pe))  # fmt: skip
        vals = torch.arange(1, 2 * n_pairs, 2)
        previous = probs[:, :, vals, vals - 1].mean(dim=(0, 2))  # (H,)
        rows = torch.tensor([b for b, nd in enumerate(needs) for _ in nd])
        qs = torch.tensor([qi for nd in needs for qi, _ in nd])
        vs = torch.tensor([vi for nd in needs for _, vi in nd])
        recall = probs[rows, :, qs, vs].mean(dim=0)  # (H,)
        recall_next = probs[rows, :, qs, vs + 1].mean(dim=0)  # (H,)
        out.append({"layer": i, "content_std": var_c**0.5, "position_std": var_p**0.5,
                    "position_share": var_p / (var_p + var_c), "spans": spans,
                    "previous": float(previous.max()), "recall": float(recall.max()),
                    "recall_next": float(recall_next.max())})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="the quality run's folder")
    p.add_argument("--cells", nargs="+", required=True, help="cell ids, as in results.jsonl")
    p.add_argument("--sequences", type=int, default=16, help="test sequences per cell")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    try:  # every cell is checked before anything is scored or written
        found = recorded_cells(out, args.cells)
    except ValueError as e:
        print(f"adaptive_span_key_pe.py: {e}", file=sys.stderr)
        return 2
    rows = []
    for r, run in found:
        cell = r["cell"]
        trained, _ = load_checkpoint(run)
        ckpt = run / (run / "latest").read_text().strip()
        torch.manual_seed(r["seed"])  # the suite's rule: the weights are a function of the seed
        init = build_model(load_config(ckpt))
        opts = BUDGETS[r["budget"]].tasks["mqar"].options
        task = MQARTask(seq_len=r["length"], batch_size=r["batch"], seed=r["seed"], **opts)
        x, y = task.split("test")
        x, y = x[: args.sequences], y[: args.sequences]
        needs = mqar_recall_positions(x, y, task.n_pairs)
        for when, model in (("init", init), ("trained", trained)):
            for layer in score_terms(model, x, needs, task.n_pairs):
                rows.append({"cell": cell, "mechanism": r["mechanism"], "when": when,
                             "test_accuracy": r.get("test") if when == "trained" else None,
                             **layer})  # fmt: skip
    with open(out / "key_pe.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    lines = [
        "| cell | weights | layer | content std | position std | position share | spans | "
        "previous | recall: value / next |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['cell']} | {row['when']} | {row['layer']} | {row['content_std']:.2f} | "
            f"{row['position_std']:.2f} | {100 * row['position_share']:.0f}% | "
            + " / ".join(f"{s:.0f}" for s in row["spans"])
            + f" | {row['previous']:.2f} | {row['recall']:.2f} / {row['recall_next']:.2f} |"
        )
    (out / "key_pe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
