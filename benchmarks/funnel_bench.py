"""Funnel-Transformer speed and memory, on the ``effiformer bench`` harness (one process per cell).

Two comparisons, each in one run so both rows share the machine's conditions:

  (a) ``encoder``: a B6-6-6 Funnel *encoder* (no decoder, no head) against an 18-layer dense
      post-LN encoder (``vanilla``, causal=False) of the same width, forward + backward.
      Target: Funnel <= 0.65x the time and the peak memory.
  (b) ``hf``: effiformer's Funnel pretraining model (encoder + decoder + tied MLM head) against HF
      transformers' ``FunnelForMaskedLM`` (the ``hf-funnel`` reference) at the same config,
      d 256, 4 heads, blocks 2-2-2, batch 2, forward + backward at 512..2048 tokens.
      Target: >= 1.5x faster, <= 0.7x the peak memory.

Examples:
  python benchmarks/funnel_bench.py encoder --dim 256 --out bench-out/funnel-a
  python benchmarks/funnel_bench.py hf --lengths 512 1024 2048 --out bench-out/funnel-b

Both write ``results.jsonl`` (with the environment) under ``--out`` and print the rows with the
ratios against the comparison row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from effiformer.bench import run_bench
from effiformer.bench.references import CellSpec, Workload, register_reference

HERE = str(Path(__file__).resolve())


def _ids(spec: CellSpec) -> torch.Tensor:
    return torch.randint(0, spec.config.vocab_size, (spec.batch, spec.seq_len), device=spec.device)


def funnel_encoder(spec: CellSpec) -> Workload:
    """effiformer's Funnel encoder only (the model for sequence-level tasks): sum of its output."""
    from effiformer.models.funnel import FunnelModel

    # No dropout, as the dense row: the same work on both sides (attention dropout would also
    # take a dense SDPA off its fused CPU kernel).
    config = dataclasses.replace(spec.config, dropout=0.0, attn_dropout=0.0)
    model = FunnelModel(config, decoder=False).to(spec.device, spec.dtype).train()
    ids = _ids(spec)
    return Workload(forward=lambda: model(ids).hidden.float().square().mean(), module=model)


def dense_encoder(spec: CellSpec) -> Workload:
    """A dense post-LN encoder with as many layers as the Funnel encoder (18 for B6-6-6), the same
    width, heads, FFN and activation; sum of its final hidden state (its tied LM head also runs)."""
    from effiformer.models.transformer import Transformer, VanillaConfig

    c = spec.config
    cfg = VanillaConfig(
        vocab_size=c.vocab_size, dim=c.dim, n_heads=c.n_heads, head_dim=c.head_dim,
        ffn_dim=c.ffn_dim, n_layers=c.n_layers, seq_len=spec.seq_len, causal=False,
        dropout=0.0, attn_dropout=0.0, norm_first=False, activation=c.activation,
    )  # fmt: skip
    model = Transformer(cfg).to(spec.device, spec.dtype).train()
    ids = _ids(spec)
    return Workload(forward=lambda: model(ids).hidden.float().square().mean(), module=model)


if __name__ != "__main__":  # registered when loaded as a --plugin (in the parent and each cell)
    register_reference("funnel", funnel_encoder, name="funnel-encoder", parts=("model",),
                       description="effiformer Funnel encoder (no decoder, no head)")  # fmt: skip
    register_reference("funnel", dense_encoder, name="dense-encoder", parts=("model",),
                       description="dense post-LN encoder, n_layers = the Funnel's depth")  # fmt: skip


def _print(records, base_label: str) -> None:
    by_len: dict[int, dict[str, dict]] = {}
    for r in records:
        by_len.setdefault(r["seq_len"], {})[r["name"]] = r
    print(f"{'row':<18}{'T':>6}{'fwd+bwd s':>11}{'peak MiB':>10}{'time x':>8}{'mem x':>7}")
    for t, rows in sorted(by_len.items()):
        base = rows.get(base_label)
        for name, r in rows.items():
            if r["status"] != "ok":
                print(f"{name:<18}{t:>6}  skipped: {r['reason']}")
                continue
            s, m = r["fwd_bwd_ms"] / 1e3, r["peak_mib"]
            tx = mx = ""
            if base is not None and base["status"] == "ok" and name != base_label:
                tx = f"{r['fwd_bwd_ms'] / base['fwd_bwd_ms']:.2f}"
                mx = f"{m / base['peak_mib']:.2f}" if base["peak_mib"] else ""
            print(f"{name:<18}{t:>6}{s:>11.3f}{m:>10.0f}{tx:>8}{mx:>7}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("which", choices=("encoder", "hf"))
    p.add_argument("--lengths", type=int, nargs="+", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--dim", type=int, default=None, help="width (encoder: 768 as registered)")
    p.add_argument(
        "--vocab", type=int, default=1000, help="vocabulary (small: the heads stay cheap)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="bench-out/funnel")
    args = p.parse_args(argv)
    common = dict(repeats=args.repeats, warmup=1, threads=args.threads, plugins=[HERE],
                  out=args.out, plot=False, measure_peak=False)  # fmt: skip
    if args.which == "encoder":
        dim = args.dim or 768
        heads = max(1, dim // 64)
        sets = [f"dim={dim}", f"n_heads={heads}", f"ffn_dim={4 * dim}", f"vocab_size={args.vocab}"]
        res = run_bench(["funnel-b6-6-6"], lengths=args.lengths or [512], batch=args.batch or 1,
                        overrides=sets, refs=["funnel-encoder", "dense-encoder"], refs_only=True,
                        **common)  # fmt: skip
        base = "dense-encoder"
    else:
        dim = args.dim or 256
        sets = [f"dim={dim}", "n_heads=4", f"ffn_dim={4 * dim}", "block_sizes=2,2,2",
                f"vocab_size={args.vocab}"]  # fmt: skip
        res = run_bench(
            ["funnel-b6-6-6"],
            lengths=args.lengths or [512, 1024, 2048],
            batch=args.batch or 2,
            overrides=sets,
            refs=["hf-funnel"],
            **common,
        )
        base = "hf-funnel"
    _print(res.records, base)
    print(json.dumps({k: res.env.get(k) for k in ("torch", "threads", "cpu", "git_sha")}))
    print(f"results: {res.results_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
