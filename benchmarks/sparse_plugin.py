"""`effiformer bench --plugin benchmarks/sparse_plugin.py`: the Sparse Transformer's measurement
configurations (issue 14) and the `local-attention` reference row.

Registers, in the parent and in every cell process (the harness imports plugins in both):

- `sparse-bench-strided-128`, `sparse-bench-fixed-128`, `sparse-bench-strided-256`:
  vanilla-small's shape (4 layers, d 256, 4 heads, causal) with sparse attention, strided l=128,
  fixed l=128 c=32 (one summary sub-block), strided l=256; merged heads; the paper's block,
  initialisation and factorized positions (`sparse-small`'s model options);
- the `local-attention` reference row (`effiformer.bench.sparse_references`), window = the
  model's stride (256 for `vanilla-small`).

They are plugin names, not library ones: the measurement needs l = 128 at 16,384 tokens, which
`--set attention.*` cannot set through the harness today (see benchmarks/README.md).
"""

from __future__ import annotations

import dataclasses

import effiformer.bench.sparse_references  # noqa: F401  (registers the local-attention row)
from effiformer.attention.sparse import SparseConfig
from effiformer.registry import get_config, list_models, register_model

_BASE = get_config("sparse-small")

_CONFIGS = {
    "sparse-bench-strided-128": ("strided", 128, "strided l=128, merged heads, vanilla-small size"),
    "sparse-bench-fixed-128": ("fixed", 128, "fixed l=128 c=32, merged heads, vanilla-small size"),
    "sparse-bench-strided-256": ("strided", 256, "strided l=256, merged heads, vanilla-small size"),
}

for _name, (_pattern, _stride, _desc) in _CONFIGS.items():
    if _name in list_models():
        continue
    register_model(
        _name,
        dataclasses.replace(
            _BASE,
            position_stride=_stride,
            attention=SparseConfig(pattern=_pattern, stride=_stride, summary=32, num_verts=1),
        ),
        _desc,
    )
