"""FLOPs of the Sparse Transformer's attention: the pattern's, what the tiled path computes, and
causal dense attention's, for one attention layer (issue 14's "count it": the fixed pattern's
summary keys grow as n c / l, which caps its speed-up over dense attention).

    python benchmarks/sparse_flops.py [--lengths 4096 16384] [--out FILE.jsonl]

Counts (query, key) pairs per head and turns them into matmul FLOPs: forward 4 Dh per pair
(Q K^T and P V), forward+backward 14 Dh (the flash backward recomputes the scores and does four
more matmuls), plus the layer's four projections (8 T D (H Dh) forward, three times that
forward+backward). Pattern pairs use closed forms checked here against
:func:`effiformer.attention.sparse.pattern_mask` at a small size; computed pairs add up each tile
call of the plan (causal triangles counted exactly, masked rectangles in full). The "FLOP limit"
is dense causal attention's forward+backward FLOPs over the pattern's: the speed-up a kernel as
efficient per FLOP as dense SDPA would reach.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

import torch

from effiformer.attention.sparse import SparseConfig, build_plan, pattern_mask


def pattern_pairs(cfg: SparseConfig, t: int, heads: int) -> int:
    """(query, key) pairs of the causal merged pattern summed over heads (closed forms)."""
    st, c = cfg.stride, cfg.summary
    i = torch.arange(t, dtype=torch.float64)
    if cfg.pattern == "strided":  # |A1 u A2| = min(i+1, l) + floor(i / l)
        per_head = (torch.clamp(i + 1, max=st) + torch.floor(i / st)).sum()
    else:  # same block up to i, and c summary keys of every earlier block
        per_head = ((i % st) + 1 + torch.floor(i / st) * c).sum()
    return int(per_head.item()) * heads


def computed_pairs(cfg: SparseConfig, t: int, heads: int) -> int:
    """Pairs the tiled path's kernel calls compute (masks count in full, triangles exactly)."""
    plan = build_plan(cfg, heads, t, causal=True)
    st, c, nt = plan.stride, plan.summary, plan.n_tiles
    total = 0
    for pc in plan.calls:
        call = pc.call
        h = call.heads[1] - call.heads[0]
        if call.kind in ("tile", "sumtile"):
            batch, tq, tk = call.q[1] - call.q[0], st, st if call.kind == "tile" else c
        elif call.kind == "col":
            batch, tq, tk = st, call.q[1] - call.q[0], call.k[1] - call.k[0]
        else:
            batch, tq, tk = 1, call.q[1] - call.q[0], call.k[1] - call.k[0]
        pairs = sum(min(q + 1, tk) for q in range(tq)) if call.causal else tq * tk
        total += batch * h * pairs
    del nt
    return total


def _check_closed_forms() -> None:
    for pattern in ("strided", "fixed"):
        cfg = SparseConfig(pattern=pattern, stride=8, summary=2)
        keep = pattern_mask(cfg, 100, 2, causal=True)
        assert int(keep.sum()) == pattern_pairs(cfg, 100, 2), pattern


def _env() -> dict:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = None
    return {"torch": torch.__version__, "python": platform.python_version(), "git_sha": sha}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--out", default=None, help="JSON lines file (default: stdout only)")
    args = p.parse_args(argv)
    _check_closed_forms()
    d, h = args.dim, args.heads
    dh = d // h
    configs = {
        "strided-128": SparseConfig(pattern="strided", stride=128),
        "fixed-128-c32": SparseConfig(pattern="fixed", stride=128, summary=32),
        "strided-256": SparseConfig(pattern="strided", stride=256),
    }
    rows = []
    for t in args.lengths:
        dense = h * t * (t + 1) // 2
        proj_fb = 3 * 8 * t * d * (h * dh)
        for name, cfg in configs.items():
            pat, comp = pattern_pairs(cfg, t, h), computed_pairs(cfg, t, h)
            rec = {
                "config": name,
                "seq_len": t,
                "dim": d,
                "heads": h,
                "keys_per_query": pat / (h * t),
                "dense_keys_per_query": dense / (h * t),
                "pattern_gflop_fwd_bwd": 14 * dh * pat / 1e9,
                "computed_gflop_fwd_bwd": 14 * dh * comp / 1e9,
                "dense_gflop_fwd_bwd": 14 * dh * dense / 1e9,
                "flop_limit_attention": dense / pat,
                "flop_limit_computed": dense / comp,
                "flop_limit_layer": (14 * dh * dense + proj_fb) / (14 * dh * pat + proj_fb),
                "env": _env(),
            }
            rows.append(rec)
            print(
                f"T={t:>6} {name:<14} keys/query {rec['keys_per_query']:8.1f} (dense "
                f"{rec['dense_keys_per_query']:.0f})  limit: attention {rec['flop_limit_attention']:.2f}x"
                f", as computed {rec['flop_limit_computed']:.2f}x, layer {rec['flop_limit_layer']:.2f}x"
            )
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
