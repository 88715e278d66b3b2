"""Reference rows for ``effiformer bench``: other implementations of Reformer LSH attention.

Two factories that build one LSH self-attention layer of another library at the cell's shape
(width, heads, chunk length and hash count taken from the cell's LSH attention config), for
``--part attention`` rows beside our LSH layer:

- ``reformer-pytorch`` (lucidrains, ``pip install reformer-pytorch``, the ``bench`` extra):
  ``reformer_pytorch.LSHSelfAttention(dim, heads, bucket_size=chunk_len, n_hashes, causal)``
  with Q/K/V/O projections, on x (B, T, D). Its ``bucket_size`` is its chunk length (its average
  bucket; trax and we use chunks of twice the average bucket), so the attention work per token is
  the same; ``use_full_attn=False`` and its threshold leave LSH on at every benchmarked length.
- ``hf-reformer-lsh`` (HF transformers, the ``reference`` extra): ``ReformerAttention`` (its
  LayerNorm, ``LSHSelfAttention`` and output projection) with ``lsh_attn_chunk_length=chunk_len``,
  ``num_hashes``, ``is_decoder`` = causal and its default bucket count (2·T/chunk rounded to a
  power of two), on x (B, T, D).

Wiring (no change to the harness needed): import this module as a plugin,
``effiformer bench vanilla-small --part attention --plugin effiformer.bench.reformer_references
--set attention.name=lsh attention.chunk_len=64 attention.n_hashes=4 --lengths 4096 8192 16384``;
the rows stand beside ``vanilla`` and ``reformer`` cells. Registering them built in means
importing this module from the harness's list of reference modules.
"""

from __future__ import annotations

from typing import Any

import torch

from ..attention.lsh import LSHConfig
from .references import CellSpec, Workload, register_reference

__all__ = ["lsh_config_of", "reformer_pytorch_reference", "hf_reformer_lsh_reference"]


def lsh_config_of(config: Any) -> LSHConfig:
    """The cell's LSH attention config: the model's ``attention`` itself, or the first LSH layer
    of a pattern. Raises when the model has no LSH attention (the row is then skipped)."""
    att = getattr(config, "attention", None)
    if isinstance(att, LSHConfig):
        return att
    for c in getattr(att, "layers", ()) or ():
        if isinstance(c, LSHConfig):
            return c
    raise ValueError(
        "the LSH reference rows need a model whose attention is LSH "
        "(--set attention.name=lsh attention.chunk_len=.. attention.n_hashes=..)"
    )


def reformer_pytorch_reference(spec: CellSpec) -> Workload:
    from reformer_pytorch import LSHSelfAttention  # imported here: the optional ``bench`` extra

    c = spec.config
    lsh = lsh_config_of(c)
    if spec.seq_len % (2 * lsh.chunk_len):
        raise ValueError(
            f"reformer-pytorch needs the length to be a multiple of 2 * bucket_size = "
            f"{2 * lsh.chunk_len}, got {spec.seq_len}"
        )
    layer = LSHSelfAttention(
        dim=c.dim,
        heads=c.n_heads,
        dim_head=c.head_dim,
        bucket_size=lsh.chunk_len,
        n_hashes=lsh.n_hashes,
        causal=bool(c.causal),
        use_full_attn=False,
        full_attn_thres=0,
    )
    layer.to(device=spec.device, dtype=spec.dtype).train()
    x = torch.randn(spec.batch, spec.seq_len, c.dim, device=spec.device, dtype=spec.dtype)
    x.requires_grad_()
    return Workload(forward=lambda: layer(x), module=layer, inputs=(x,))


def hf_reformer_lsh_reference(spec: CellSpec) -> Workload:
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import ReformerAttention

    c = spec.config
    lsh = lsh_config_of(c)
    config = ReformerConfig(
        attn_layers=["lsh"],
        hidden_size=c.dim,
        num_attention_heads=c.n_heads,
        attention_head_size=c.head_dim,
        lsh_attn_chunk_length=lsh.chunk_len,
        num_hashes=lsh.n_hashes,
        num_buckets=None,
        lsh_num_chunks_before=lsh.n_chunks_before,
        lsh_num_chunks_after=lsh.n_chunks_after,
        is_decoder=bool(c.causal),
        lsh_attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
        max_position_embeddings=max(spec.seq_len, 64),
        axial_pos_embds=False,
    )
    layer = ReformerAttention(config, layer_id=0)
    layer.to(device=spec.device, dtype=spec.dtype).train()
    x = torch.randn(spec.batch, spec.seq_len, c.dim, device=spec.device, dtype=spec.dtype)
    x.requires_grad_()
    return Workload(forward=lambda: layer(x).hidden_states, module=layer, inputs=(x,))


register_reference(
    "*",
    reformer_pytorch_reference,
    name="reformer-pytorch",
    parts=("attention",),
    requires=("reformer_pytorch",),
    attention=("lsh",),
    description="lucidrains reformer-pytorch LSHSelfAttention, same width/heads/chunk/hashes",
)
register_reference(
    "*",
    hf_reformer_lsh_reference,
    name="hf-reformer-lsh",
    parts=("attention",),
    requires=("transformers",),
    attention=("lsh",),
    description="HF transformers ReformerAttention (LSH), same width/heads/chunk/hashes",
)
