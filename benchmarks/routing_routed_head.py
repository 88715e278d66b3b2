"""What a trained Routing Transformer LM does with its routed heads: quality-suite LM cells
scored on the validation split as trained, with the routed heads' output zeroed, and with the
local heads' output zeroed (at evaluation only: the weights are the trained ones), and each head
type's share of the attention output.

The question (docs/quality.md, issue 22): on PTB at 1,024 tokens routing (one local head, one
routed head) ends far behind its own local path trained alone. Training the same model with the
routed head muted (the ``routing-mute`` ablation) answers whether the routed head harms or only
fails to help; this script answers how the trained routing model uses it: if zeroing the routed
head at evaluation costs little, the model has learned to ignore it and the harm happened during
training; if it costs much, the model leans on a head that is worth less than a second local head.

    python benchmarks/routing_routed_head.py --out benchmarks/results/quality_cpu_lm \\
        --cells lm-shakespeare/routing/T1024/lr0.003/s0 --data ../shared/data

Reads each cell's record in ``OUT/results.jsonl`` and its last checkpoint in ``OUT/cells/``;
writes ``OUT/routed_head.jsonl`` and ``OUT/routed_head.md``. ``share``: per routing layer, the
RMS over tokens of the output projection applied to the routed heads' output alone (the local
columns zeroed), over the sum of that and the same for the local heads, on the first validation
sequences (``--sequences``); ``unrouted``: per routing layer, the fraction of (token, routed
head) pairs that no centroid chose, whose routed output is zero; both also for the cell's model
at initialisation (built again from its seed, as the suite builds it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from effiformer.attention.routing import RoutingAttention
from effiformer.bench.quality import (
    BUDGETS,
    TASKS,
    _make_cell,
    _task_setup,
    module_inputs,
    recorded_cells,
)
from effiformer.checkpoint import load_checkpoint
from effiformer.cli.common import positive_int


def _columns(m: RoutingAttention) -> int:
    """Input columns of the output projection that hold the routed heads (the first heads)."""
    return m.n_routing * m.dims.head_dim


class Zeroed:
    """Zero the ``which`` ("routed" or "local") heads' output before every routing layer's
    output projection while active (``with Zeroed(model, "routed"): ...``)."""

    def __init__(self, model: torch.nn.Module, which: str) -> None:
        if which not in ("routed", "local"):
            raise ValueError(f"which must be 'routed' or 'local', got {which!r}")
        self.layers = [m for m in model.modules() if isinstance(m, RoutingAttention)]
        self.which = which
        self.hooks: list = []

    def __enter__(self) -> Zeroed:
        for m in self.layers:
            c = _columns(m)

            def pre(_mod, args, c=c):
                (o,) = args
                o = o.clone()
                if self.which == "routed":
                    o[..., :c] = 0
                else:
                    o[..., c:] = 0
                return (o,)

            self.hooks.append(m.o_proj.register_forward_pre_hook(pre))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


@torch.no_grad()
def output_shares(model: torch.nn.Module, x: torch.Tensor) -> list[float]:
    """Per routing layer: RMS of o_proj(routed part) / (RMS routed + RMS local), on ``x``."""
    return [s for s, _ in _layer_stats(model, x)]


@torch.no_grad()
def unrouted(model: torch.nn.Module, x: torch.Tensor) -> list[float]:
    """Per routing layer: the fraction of (token, routed head) whose routed output is exactly
    zero, on ``x``: tokens that no centroid chose (balanced routing gives each centroid its top
    ``w`` tokens; a token in no centroid's top ``w`` gets nothing from that head)."""
    return [u for _, u in _layer_stats(model, x)]


@torch.no_grad()
def _layer_stats(model: torch.nn.Module, x: torch.Tensor) -> list[tuple[float, float]]:
    layers = [m for m in model.modules() if isinstance(m, RoutingAttention)]
    seen = {i: h for i, (_, h, _) in enumerate(module_inputs(model, x, [m.o_proj for m in layers]))}
    stats = []
    for i, m in enumerate(layers):
        c, o = _columns(m), seen[i]
        routed, local = o.clone(), o.clone()
        routed[..., c:] = 0
        local[..., :c] = 0
        r = m.o_proj(routed).pow(2).mean().sqrt()
        loc = m.o_proj(local).pow(2).mean().sqrt()
        heads = o[..., :c].unflatten(-1, (m.n_routing, m.dims.head_dim))  # (B, T, H_r, Dh)
        zero = float((heads == 0).all(dim=-1).double().mean()) if c else 0.0
        stats.append((float(r / (r + loc)) if float(r + loc) > 0 else 0.0, zero))
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="the quality run's folder")
    p.add_argument("--cells", nargs="+", required=True, help="LM cell ids, as in results.jsonl")
    p.add_argument("--data", required=True, help="folder holding ptb/ and tinyshakespeare/")
    p.add_argument(
        "--sequences", type=positive_int, default=4, help="validation rows for the shares"
    )
    p.add_argument("--eval-tokens", type=positive_int, default=None,
                   help="score a prefix of the validation split (default: all of it)")  # fmt: skip
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    name = "routing_routed_head.py"
    try:  # every cell is checked before anything is scored or written
        found = recorded_cells(out, args.cells)
    except ValueError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    for r, _ in found:
        if TASKS[r["task"]][0] != "lm":
            print(f"{name}: {r['cell']} is not a language-modelling cell", file=sys.stderr)
            return 2
    rows = []
    for r, run in found:
        cell_id = r["cell"]
        cell = _make_cell(BUDGETS[r["budget"]], r["task"], r["mechanism"], r["length"], r["lr"],
                          r["seed"], None, data=args.data)  # fmt: skip
        task, init = _task_setup(cell)  # init: the cell's model at initialisation (its seed)
        task.eval_tokens = args.eval_tokens
        model, _ = load_checkpoint(run)
        model.eval()
        if not any(isinstance(m, RoutingAttention) for m in model.modules()):
            print(f"{name}: {cell_id}'s model has no routing attention", file=sys.stderr)
            return 2
        row = {"cell": cell_id, "mechanism": r["mechanism"], "eval_tokens": args.eval_tokens,
               "record_valid": r.get("valid")}  # fmt: skip
        row["valid"] = task.evaluate(model, "valid")["bpc"]
        for which in ("routed", "local"):
            with Zeroed(model, which):
                row[f"valid_{which}_zeroed"] = task.evaluate(model, "valid")["bpc"]
        t = task.seq_len
        data = task.corpus.split("valid")[: args.sequences * t]
        x = data[: data.numel() // t * t].view(-1, t)  # (sequences, T): consecutive windows
        row["routed_share"] = output_shares(model, x)
        row["unrouted"] = unrouted(model, x)
        row["init_routed_share"] = output_shares(init, x)
        row["init_unrouted"] = unrouted(init, x)
        rows.append(row)
    with open(out / "routed_head.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    lines = [
        "| cell | valid bpc | routed heads zeroed | local heads zeroed | routed share of the "
        "attention output, per routing layer (at init) | tokens no centroid chose, per routing "
        "layer (at init) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['cell']} | {row['valid']:.3f} | {row['valid_routed_zeroed']:.3f} | "
            f"{row['valid_local_zeroed']:.3f} | "
            + " / ".join(f"{s:.2f}" for s in row["routed_share"])
            + " ("
            + " / ".join(f"{s:.2f}" for s in row["init_routed_share"])
            + ") | "
            + " / ".join(f"{100 * u:.0f}%" for u in row["unrouted"])
            + " ("
            + " / ".join(f"{100 * u:.0f}%" for u in row["init_unrouted"])
            + ") |"
        )
    (out / "routed_head.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
