"""Why the tiled path and not FlexAttention on CPU: forward time of the causal strided pattern
(l = 128) at 16,384 tokens, d 256, 4 heads, with compiled FlexAttention over a block mask in the
natural order, the tiled path (effiformer.attention.sparse) and dense causal SDPA.

    python benchmarks/sparse_flex_cpu.py [--length 16384] [--threads 2]

Forward only: FlexAttention in torch 2.13 has no backward on CPU ("FlexAttention does not
support backward on CPU"), which rules it out for training here. In the natural order the
pattern's second step touches every key block, so the block mask is barely sparser than causal
(its `sparsity()` is printed) and FlexAttention does about dense causal work. The compiled
callable is built once and reused (compile time is reported apart); eager FlexAttention is never
timed.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from effiformer.attention.sparse import SparseConfig, build_plan, tiled_attention


def _best(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    b, h, t, dh, st = 1, 4, args.length, 64, 128

    def strided(b_, h_, q, k):
        return (k <= q) & (((q - k) < st) | (((q - k) % st) == 0))

    t0 = time.perf_counter()
    mask = create_block_mask(strided, None, None, t, t, device="cpu")
    print(f"block mask built in {time.perf_counter() - t0:.1f} s, sparsity {mask.sparsity():.1f}%")
    flex = torch.compile(flex_attention, dynamic=False)
    q, k, v = (torch.randn(b, h, t, dh) for _ in range(3))  # (B, H, T, Dh)
    t0 = time.perf_counter()
    with torch.no_grad():
        flex(q, k, v, block_mask=mask)
    print(f"compile + first call {time.perf_counter() - t0:.1f} s")
    cfg = SparseConfig(pattern="strided", stride=st)
    qn, kn, vn = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (B, T, H, Dh)

    def tiled():
        with torch.no_grad():
            return tiled_attention(qn, kn, vn, build_plan(cfg, h, t, causal=True))

    with torch.no_grad():
        diff = (flex(q, k, v, block_mask=mask) - tiled().transpose(1, 2)).abs().max().item()
        print(f"max |flex - tiled| = {diff:.2e}")
        f = _best(lambda: flex(q, k, v, block_mask=mask))
        ti = _best(tiled)
        d = _best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1)
    print(f"forward: flex {f:.3f} s, tiled {ti:.3f} s, dense causal SDPA {d:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
