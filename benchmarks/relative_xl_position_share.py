"""How much of a Transformer-XL relative attention score the position terms carry at
initialisation, in the quality suite's MQAR model: per layer, the variance over (query, earlier
key) pairs of the content terms ``(q + u) . k`` and of the position terms ``(q + v) . W_{k,R}
R_{i-j}`` (both over sqrt(Dh)), and the position terms' share of their sum.

The question (docs/quality.md, issue 22): relative-XL stays on MQAR's plateau at 1,024 tokens
where dense leaves it. Adaptive span's cause was a random distance preference at
initialisation (its key position embeddings' N(0, 1) start); the relative position terms give
every head one too. This measures how large it is, for the suite's row and for the
``relative-xl-r0`` ablation (``W_{k,R}`` started at zero).

    python benchmarks/relative_xl_position_share.py \\
        --out benchmarks/results/quality_cpu_mqar_ablations

Builds each cell's model at initialisation exactly as the suite does (its seed), feeds one
training sequence of the task at ``--length``; ``--trained FOLDER:CELL ...`` measures trained
cells too (their last checkpoint, one test sequence); writes ``OUT/position_share.jsonl`` and
``OUT/position_share.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from effiformer.attention.relative_xl import RelativeXLAttention
from effiformer.bench.quality import BUDGETS, _make_cell, _task_setup, module_inputs, recorded_cells
from effiformer.checkpoint import load_checkpoint
from effiformer.cli.common import positive_int

NAME = "relative_xl_position_share.py"
BANDS = ((0, 0), (1, 1), (2, 8), (9, 64), (65, 256), (257, 1023), (1024, 16383))


@torch.no_grad()
def position_share(model: torch.nn.Module, x: torch.Tensor) -> list[dict[str, float]]:
    """Per relative-XL layer of ``model`` on ``x`` (B, T): the variance of the content and of the
    position score terms over the causal (query, key) pairs, and the position share."""
    layers = [m for m in model.modules() if isinstance(m, RelativeXLAttention)]
    seen = [(m, h, kw["positions"]) for m, h, kw in module_inputs(model, x, layers)]
    out = []
    for m, h, pos in seen:
        b, t, _ = h.shape
        heads, dh = m.n_heads, m.head_dim
        q = m.q_proj(h).view(b, t, heads, dh)
        k = m.k_proj(h).view(b, t, heads, dh)
        rk = m.r_proj(pos.r).view(-1, heads, dh)  # (T, H, Dh): distances T-1 ... 0
        u = pos.u if pos.u is not None else m.u_bias
        v = pos.v if pos.v is not None else m.v_bias
        content = torch.einsum("bihd,bjhd->bhij", q + u, k) / math.sqrt(dh)
        by_index = torch.einsum("bihd,jhd->bhij", q + v, rk) / math.sqrt(dh)
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        index = (t - 1 - (i - j)).clamp(0, t - 1).expand(b, heads, t, t)  # distance i - j
        position = torch.gather(by_index, 3, index)
        keep = j <= i
        vc, vp = float(content[..., keep].var()), float(position[..., keep].var())
        base = position[..., keep].mean(dim=(0, 2))  # (H,)
        profile = {}
        for lo, hi in BANDS:
            band = keep & (i - j >= lo) & (i - j <= hi)
            if band.any():
                profile[f"{lo}-{hi}"] = (position[..., band].mean(dim=(0, 2)) - base).tolist()
        out.append({"content_var": vc, "position_var": vp, "share": vp / (vc + vp),
                    "profile": profile})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="folder for position_share.jsonl / .md")
    p.add_argument("--mechanisms", nargs="+", default=["relative-xl", "relative-xl-r0"])
    p.add_argument("--length", type=positive_int, default=1024)
    p.add_argument("--budget", default="cpu", choices=sorted(BUDGETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trained", nargs="*", default=[], metavar="FOLDER:CELL",
                   help="trained cells too: a quality run's folder and a cell id, colon-joined "
                        "(the cell's last checkpoint, on one test sequence of its task)")  # fmt: skip
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    trained = []  # every trained cell is found before anything is measured or written
    for spec in args.trained:
        folder, _, cid = spec.partition(":")
        try:
            ((rec, run),) = recorded_cells(folder, [cid])
        except ValueError as e:
            print(f"{NAME}: {e}", file=sys.stderr)
            return 2
        if rec["task"] != "mqar":
            print(f"{NAME}: {cid} is not an MQAR cell", file=sys.stderr)
            return 2
        trained.append((rec, run))
    rows = []
    for mech in args.mechanisms:
        try:
            cell = _make_cell(BUDGETS[args.budget], "mqar", mech, args.length, 1e-3, args.seed,
                              None, data=None)  # fmt: skip
            task, model = _task_setup(cell)
        except (KeyError, ValueError) as e:
            print(f"{NAME}: {mech} at {args.length}: {e}", file=sys.stderr)
            return 2
        if not any(isinstance(m, RelativeXLAttention) for m in model.modules()):
            print(f"{NAME}: {mech} has no relative-XL attention", file=sys.stderr)
            return 2
        x = task.generate(1, torch.Generator().manual_seed(args.seed))[0]  # (1, T)
        for layer, r in enumerate(position_share(model, x)):
            rows.append({"mechanism": mech, "length": args.length, "seed": args.seed,
                         "weights": "init", "layer": layer, **r})  # fmt: skip
    for rec, run in trained:
        model, _ = load_checkpoint(run)
        if not any(isinstance(m, RelativeXLAttention) for m in model.modules()):
            continue  # no position terms to measure (a dense cell beside them)
        step = (run / "latest").read_text().strip()
        cell = _make_cell(BUDGETS[rec["budget"]], "mqar", rec["mechanism"], rec["length"],
                          rec["lr"], rec["seed"], None, data=None)  # fmt: skip
        task, _ = _task_setup(cell)
        x = task.split("test")[0][:1]  # (1, T)
        for layer, r in enumerate(position_share(model, x)):
            rows.append({"mechanism": rec["mechanism"], "length": rec["length"],
                         "seed": rec["seed"], "weights": f"trained ({step})", "cell": rec["cell"],
                         "layer": layer, **r})  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "position_share.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["Relative-XL score terms at initialisation (MQAR model, one sequence, causal pairs):",
             "", "| row | T | weights | layer | content variance | position variance | "
             "position share |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['mechanism']} | {r['length']} | {r['weights']} | {r['layer']} | "
                     f"{r['content_var']:.3f} | {r['position_var']:.3f} | {r['share']:.2f} |")  # fmt: skip
    lines += ["", "The position terms by distance i - j (their mean over the band's (query, key) "
              "pairs minus their mean over all causal pairs; per head, `h0 / h1 ...`): how the "
              "terms alone would move a head's weight toward (+) or away from (-) a band:", "",
              "| row | T | weights | layer | "
              + " | ".join(f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi in BANDS) + " |",
              "|---|---|---|---|" + "---|" * len(BANDS)]  # fmt: skip
    for r in rows:
        cols = [r["profile"].get(f"{lo}-{hi}") for lo, hi in BANDS]
        lines.append(f"| {r['mechanism']} | {r['length']} | {r['weights']} | {r['layer']} | "
                     + " | ".join("-" if c is None else " / ".join(f"{v:+.1f}" for v in c)
                                  for c in cols) + " |")  # fmt: skip
    (out / "position_share.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
