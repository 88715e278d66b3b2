"""Matmul FLOPs (forward + backward) of the two Funnel speed comparisons, to bound what is possible.

:func:`effiformer.flops.counted_flops` counts every matmul-like aten call (mm, addmm, bmm,
baddbmm, ...) of one training step, with the library's formulas for the SDPA kernels PyTorch
has none for (the CPU flash kernel: 4 B H Tq Tk Dh forward and 10 B H Tq Tk Dh backward without
a causal mask; the backward recomputes Q K^T and forms dV, dP, dQ, dK). Nothing is timed. It prints, for the same two pairs of
rows as ``benchmarks/funnel_bench.py``:

  (a) ``encoder``: the B6-6-6 Funnel encoder against the 18-layer dense encoder (dropout 0);
  (b) ``hf``: effiformer's Funnel MLM model against HF's ``FunnelForMaskedLM`` (d 256, 4 heads,
      blocks 2-2-2 with decoder, batch 2; needs the ``reference`` extra).

A time ratio can only beat the FLOP ratio where the slower row wastes time outside its matmuls.

    python benchmarks/funnel_flops.py --dims 256 768 --hf
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from effiformer.flops import counted_flops
from effiformer.registry import build_model, get_config


def step_flops(loss_fn) -> int:
    """FLOPs of ``loss_fn()`` and its backward pass (:func:`effiformer.flops.counted_flops`)."""
    return counted_flops(lambda: loss_fn().backward())


def encoder_pair(dim: int, seq_len: int, batch: int) -> dict:
    from effiformer.models.funnel import FunnelModel
    from effiformer.models.transformer import Transformer, VanillaConfig

    c = get_config("funnel-b6-6-6", dim=dim, n_heads=dim // 64, ffn_dim=4 * dim, vocab_size=1000)
    c = dataclasses.replace(c, dropout=0.0, attn_dropout=0.0)
    funnel = FunnelModel(c, decoder=False).train()
    dense = Transformer(
        VanillaConfig(
            vocab_size=1000, dim=dim, n_heads=c.n_heads, head_dim=c.head_dim, ffn_dim=c.ffn_dim,
            n_layers=c.n_layers, seq_len=seq_len, causal=False, dropout=0.0, attn_dropout=0.0,
            norm_first=False, activation=c.activation,
        )
    ).train()  # fmt: skip
    ids = torch.randint(0, 1000, (batch, seq_len))
    f = step_flops(lambda: funnel(ids).hidden.float().square().mean())
    d = step_flops(lambda: dense(ids).hidden.float().square().mean())
    return {"pair": "encoder", "dim": dim, "seq_len": seq_len, "batch": batch,
            "funnel_gflop": f / 1e9, "dense_gflop": d / 1e9, "ratio": f / d}  # fmt: skip


def hf_pair(seq_len: int, batch: int) -> dict:
    import transformers

    from effiformer.interop.hf_funnel import config_to_hf

    c = get_config(
        "funnel-b6-6-6", dim=256, n_heads=4, ffn_dim=1024, block_sizes=(2, 2, 2),
        vocab_size=1000, seq_len=seq_len,
    )  # fmt: skip
    fields = config_to_hf(c, "FunnelForMaskedLM")
    for key in ("architectures", "model_type"):
        fields.pop(key)
    hf = transformers.FunnelForMaskedLM(transformers.FunnelConfig(**fields)).train()
    ours = build_model(c).train()
    ids = torch.randint(0, 1000, (batch, seq_len))
    o = step_flops(lambda: ours(ids, targets=ids).total_loss)
    h = step_flops(lambda: hf(ids, labels=ids).loss)
    return {"pair": "hf", "seq_len": seq_len, "batch": batch,
            "ours_gflop": o / 1e9, "hf_gflop": h / 1e9, "ratio": o / h}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dims", type=int, nargs="*", default=[256, 768], help="encoder widths")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=1, help="encoder batch (FLOPs scale with it)")
    p.add_argument("--hf", action="store_true", help="also the HF pair (reference extra)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for dim in args.dims:
        print(json.dumps(encoder_pair(dim, args.seq_len, args.batch)), flush=True)
    if args.hf:
        print(json.dumps(hf_pair(args.seq_len, 2)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
