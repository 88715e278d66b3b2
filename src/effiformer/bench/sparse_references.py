"""Reference rows for the Sparse Transformer's attention (Child et al. 2019) in ``effiformer bench``.

- ``local-attention`` (vanilla family, ``--part attention``): the public ``local-attention``
  package (lucidrains, PyPI ``local-attention``; the ``bench`` extra) — causal (or not, with
  the config) sliding-window attention in windows of ``window`` with look-back 1 (each query
  sees its own window and the one before it, the same l to 2l keys as a strided layer's first
  step), inside the same Q, K, V, O projections as our attention layer, so the row stands beside
  our ``--part attention`` row (the model's first layer) at the same shape. ``window`` is the model's
  ``attention.stride`` when its attention has one (a sparse layer), else 256. No rotary
  embedding (``dim`` not passed), ``autopad=True`` for lengths that are not multiples of the
  window.

Registered when this module is imported: ``effiformer bench ... --plugin
effiformer.bench.sparse_references`` (or from the harness's list of built-in reference modules).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .references import CellSpec, Workload, register_reference

__all__ = ["local_attention_window", "LocalAttentionLayer", "local_attention_reference"]

DEFAULT_WINDOW = 256


def local_attention_window(spec: CellSpec) -> int:
    """The window of the ``local-attention`` row: the sparse layer's stride, else 256."""
    return int(getattr(spec.config.attention, "stride", DEFAULT_WINDOW))


class LocalAttentionLayer(nn.Module):
    """x (B, T, D) -> (B, T, D): Q, K, V projections, ``local_attention.LocalAttention`` over
    (B, H, T, Dh), O projection."""

    def __init__(self, dim: int, n_heads: int, head_dim: int, window: int, causal: bool) -> None:
        super().__init__()
        from local_attention import LocalAttention  # the optional ``bench`` extra

        self.n_heads, self.head_dim = n_heads, head_dim
        inner = n_heads * head_dim
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, inner) for _ in range(3))
        self.o_proj = nn.Linear(inner, dim)
        self.attn = LocalAttention(
            window_size=window,
            causal=causal,
            look_backward=1,
            look_forward=0 if causal else 1,
            dropout=0.0,
            autopad=True,
        )

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape

        def heads(p: nn.Linear) -> Tensor:
            return p(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

        o = self.attn(heads(self.q_proj), heads(self.k_proj), heads(self.v_proj))
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))  # (B, T, D)


def local_attention_reference(spec: CellSpec) -> Workload:
    c = spec.config
    layer = LocalAttentionLayer(
        c.dim, c.n_heads, c.head_dim, local_attention_window(spec), bool(c.causal)
    )
    layer.to(device=spec.device, dtype=spec.dtype).train()
    x = torch.randn(spec.batch, spec.seq_len, c.dim, device=spec.device, dtype=spec.dtype)
    x.requires_grad_()
    return Workload(forward=lambda: layer(x), module=layer, inputs=(x,))


def _local_attention_estimate(spec: CellSpec) -> int:
    c = spec.config
    elt = torch.empty((), dtype=spec.dtype).element_size()
    w = local_attention_window(spec)
    looked = 2 * w if c.causal else 3 * w
    b, h, t = spec.batch, c.n_heads, spec.seq_len
    # scores, probabilities and their gradients per window, plus the looked-around keys/values.
    return elt * (4 * b * h * t * looked + 12 * b * t * max(c.dim, c.inner_dim))


register_reference(
    "*",
    local_attention_reference,
    name="local-attention",
    parts=("attention",),
    requires=("local_attention",),
    attention=("sparse", "local"),
    description="lucidrains local-attention, window = attention.stride or 256, look-back 1, "
    "with our Q/K/V/O projections",
    estimate_bytes=_local_attention_estimate,
)
