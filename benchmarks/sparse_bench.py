"""`effiformer bench` with the Sparse Transformer's measurement configurations registered.

    python benchmarks/sparse_bench.py NAMES... [effiformer bench options]

is `effiformer bench NAMES... --plugin benchmarks/sparse_plugin.py [options]` (written when the
harness resolved NAMES before importing `--plugin` files; it now imports them first, so the
plain command works as well). Every cell runs in its own process and imports the plugin there.

The issue-14 measurement (one attention layer, d 256, 4 heads, batch 1, causal):

    python benchmarks/sparse_bench.py sparse-bench-strided-128 sparse-bench-fixed-128 \\
        sparse-bench-strided-256 vanilla-small --part attention --lengths 4096 16384 \\
        --out benchmarks/results/sparse_attention_bench
"""

from __future__ import annotations

import sys
from pathlib import Path

from effiformer.bench.cell import load_plugin
from effiformer.cli import main

PLUGIN = str(Path(__file__).with_name("sparse_plugin.py"))

if __name__ == "__main__":
    load_plugin(PLUGIN)  # same module name the harness uses, so it is not imported twice
    sys.exit(main(["bench", *sys.argv[1:], "--plugin", PLUGIN]))
