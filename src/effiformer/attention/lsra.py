"""Long-Short Range Attention (LSRA), the self-attention of Lite Transformer.

Wu, Liu, Lin, Lin and Han, "Lite Transformer with Long-Short Range Attention", ICLR 2020
(arXiv 2004.11886), sec. 3.2 and fig. 3; layout from the official code
(``mit-han-lab/lite-transformer``: ``fairseq/modules/multibranch.py``, the
``transformer_multibranch_v2`` model and its configs).

The ``d`` channels of the block input are split: the first ``a = attention_fraction * d`` go to
multi-head self-attention (``attn_heads`` heads, its own Q/K/V/O projections of width ``a``:
the global, long-range branch), the other ``d - a`` to a convolution branch
(:class:`~effiformer.attention.convolution.ConvBranch`: its own input linear (and GLU), a
lightweight or dynamic depthwise convolution of ``conv_heads`` weight-sharing kernel groups,
its own output linear: the local, short-range branch). The two outputs are concatenated,
attention first, with **no projection after the concatenation** (``MultiBranch`` cats the branch
outputs; each branch ends in its own output linear), so output channels ``0 .. a-1`` depend only
on the attention branch's parameters and ``a .. d-1`` only on the convolution branch's. In every
released configuration ``a = d / 2`` with 4 attention heads and 4 kernel groups (branch types
``attn:1:d/2:4`` and ``lightweight|dynamic:default:d/2:4``).

The convolution is centred (``(K-1)//2`` on the left) in a bidirectional mask and causal
(``K - 1`` on the left) in a causal one; the kernel size varies by layer (``kernel_sizes``:
``(3, 7, 15, 31, 31, 31)`` by default, the official ``--encoder/decoder-kernel-size-list``; one
entry means every layer, a longer list is cut to the depth as the official code does).

Only self-attention is split: encoder-decoder attention stays full width (the model builds it).

Incremental decoding: the state is :class:`LSRAState`, the attention branch's
:class:`~effiformer.attention.base.KVCache` and the convolution's buffer of the last ``K - 1``
convolution inputs (zeros before the first token), both with batch rows first so that beam
search reorders them with the default :meth:`reorder_decoding_state`.

Deliberate deviations from the official code:

- Padded positions are zeroed just before the convolution, after the branch's input linear and
  GLU (as fairseq's LightConv encoder layer does); the official ``MultiBranch`` zeroes the
  branch *input*, so its input linear's bias (through the GLU) reaches the real positions next
  to padding and a sentence's encoding depends on how much its batch is padded. Here it does
  not.
- A lightweight kernel's DropConnect mask is one (H, K) mask per forward (the CUDA kernel's
  behaviour, which trained the paper's models), not one per position (the CPU fallback's); see
  :mod:`effiformer.attention.convolution` for this and the efficient CPU forms.
- ``kv`` (another key/value sequence: memory, pooled queries) is refused: the convolution branch
  runs over ``x`` only.

Also registered, for the "Pay Less Attention" baseline (Wu et al. 2019, arXiv 1901.10430):
``lightconv`` and ``dynamicconv``, the same part with every channel in the convolution branch
(``attention_fraction=0``) and fairseq's LightConv block defaults (16 kernel groups, GLU after
the input linear, kernel sizes (3, 7, 15, 31, 31, 31, 31)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import AttentionConfig, ConfigError
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    KVCache,
    check_attention_inputs,
    reference_attention,
)
from .convolution import CONV_METHODS, ConvBranch
from .dense import DenseAttention, DenseConfig
from .registry import register_attention

__all__ = [
    "DynamicConvConfig",
    "LSRAAttention",
    "LSRAConfig",
    "LSRAState",
    "LightConvConfig",
    "branch_widths",
]

CONV_TYPES = ("lightweight", "dynamic")


@dataclass(frozen=True, kw_only=True)
class LSRAConfig(AttentionConfig):
    """Long-Short Range Attention.

    ``conv``: "lightweight" (a learned kernel per group) or "dynamic" (kernels computed from each
    position); ``kernel_sizes``: taps per layer (one entry: every layer); ``attention_fraction``:
    share of the channels given to the attention branch (the first ones; 0.5 in the paper, 1.0:
    plain dense attention, 0.0: convolution only); ``attn_heads``: heads of the attention branch;
    ``conv_heads``: weight-sharing kernel groups of the convolution; ``glu``: the convolution
    branch's input linear doubles its width and a GLU halves it back (the WMT configs, with
    dynamic convolutions); ``weight_softmax``: softmax over the taps; ``weight_dropout``:
    DropConnect on the kernel in training; ``method``: the convolution's form
    (:data:`~effiformer.attention.convolution.CONV_METHODS`). The attention branch's dropout on
    its weights is the model's ``attn_dropout``.
    """

    name = "lsra"

    conv: str = "lightweight"
    kernel_sizes: tuple[int, ...] = (3, 7, 15, 31, 31, 31)
    attention_fraction: float = 0.5
    attn_heads: int = 4
    conv_heads: int = 4
    glu: bool = False
    weight_softmax: bool = True
    weight_dropout: float = 0.0
    method: str = "auto"

    def __post_init__(self) -> None:
        self._check_choice("conv", CONV_TYPES)
        self._check_choice("method", CONV_METHODS)
        ks = self.kernel_sizes
        if isinstance(ks, int) and not isinstance(ks, bool):
            object.__setattr__(self, "kernel_sizes", (ks,))
            ks = self.kernel_sizes
        if isinstance(ks, list):
            object.__setattr__(self, "kernel_sizes", tuple(ks))
            ks = self.kernel_sizes
        if (
            not isinstance(ks, tuple)
            or not ks
            or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks)
        ):
            raise ConfigError(
                f"attention.kernel_sizes must be a non-empty tuple of positive ints, got {ks!r}"
            )
        f = self.attention_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 <= f <= 1.0:
            raise ConfigError(f"attention.attention_fraction must be in [0, 1], got {f!r}")
        self._check_positive("attn_heads")
        self._check_positive("conv_heads")
        if not 0.0 <= self.weight_dropout < 1.0:
            raise ConfigError(
                f"attention.weight_dropout must be in [0, 1), got {self.weight_dropout!r}"
            )
        if self.conv == "dynamic" and self.method == "conv1d":
            raise ConfigError(
                "attention.method='conv1d' computes lightweight kernels only; use 'auto', "
                "'band' or 'unfold' with conv='dynamic'"
            )

    def for_layer(self, layer: int, n_layers: int) -> LSRAConfig:
        """This config with ``kernel_sizes`` reduced to layer ``layer``'s one entry."""
        ks = self.kernel_sizes
        if len(ks) == 1:
            return self
        if len(ks) < n_layers:
            raise ConfigError(
                f"attention.kernel_sizes has {len(ks)} entries for {n_layers} layers: give one "
                "per layer (a longer list is cut to the depth) or one for every layer"
            )
        return dataclasses.replace(self, kernel_sizes=(ks[layer],))

    @property
    def kernel_size(self) -> int:
        """The kernel size of a config resolved for one layer (one entry)."""
        if len(self.kernel_sizes) != 1:
            raise ConfigError(
                f"kernel_sizes {self.kernel_sizes} holds one entry per layer; resolve it with "
                "for_layer(layer, n_layers) first"
            )
        return self.kernel_sizes[0]


@dataclass(frozen=True, kw_only=True)
class LightConvConfig(LSRAConfig):
    """Lightweight convolution in place of self-attention ("Pay Less Attention", Wu et al. 2019,
    fairseq ``lightconv``): every channel in the convolution branch, 16 kernel groups, GLU after
    the input linear, kernel sizes (3, 7, 15, 31, 31, 31, 31)."""

    name = "lightconv"

    conv: str = "lightweight"
    kernel_sizes: tuple[int, ...] = (3, 7, 15, 31, 31, 31, 31)
    attention_fraction: float = 0.0
    conv_heads: int = 16
    glu: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.conv != "lightweight":
            raise ConfigError(
                "attention.conv must be 'lightweight' for lightconv (see dynamicconv)"
            )


@dataclass(frozen=True, kw_only=True)
class DynamicConvConfig(LSRAConfig):
    """Dynamic convolution in place of self-attention ("Pay Less Attention", Wu et al. 2019,
    fairseq ``lightconv`` with ``--encoder-conv-type dynamic``): as :class:`LightConvConfig` with
    kernels computed from each position."""

    name = "dynamicconv"

    conv: str = "dynamic"
    kernel_sizes: tuple[int, ...] = (3, 7, 15, 31, 31, 31, 31)
    attention_fraction: float = 0.0
    conv_heads: int = 16
    glu: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.conv != "dynamic":
            raise ConfigError("attention.conv must be 'dynamic' for dynamicconv (see lightconv)")


def branch_widths(config: LSRAConfig, dim: int) -> tuple[int, int]:
    """(attention width, convolution width) of an LSRA layer of width ``dim``; raises
    :class:`ConfigError` when the split does not fit the heads and kernel groups."""
    exact = config.attention_fraction * dim
    a = int(round(exact))
    if abs(exact - a) > 1e-9:
        raise ConfigError(
            f"attention.attention_fraction={config.attention_fraction} of dim={dim} is not a "
            "whole number of channels"
        )
    c = dim - a
    if a and a % config.attn_heads:
        raise ConfigError(
            f"the attention branch's {a} channels must split into attention.attn_heads="
            f"{config.attn_heads} heads"
        )
    if c and c % config.conv_heads:
        raise ConfigError(
            f"the convolution branch's {c} channels must split into attention.conv_heads="
            f"{config.conv_heads} kernel groups"
        )
    return a, c


@dataclass(frozen=True)
class LSRAState:
    """Incremental decoding state of an LSRA layer: ``attn``, the attention branch's KVCache
    (None without an attention branch); ``conv``, the convolution inputs of the last ``K - 1``
    positions, (R, K - 1, C) (None without a convolution branch); ``seen``, the positions
    decoded so far."""

    attn: KVCache | None
    conv: Tensor | None
    seen: int = 0

    @property
    def length(self) -> int:
        """Positions already decoded (what the model places the next token after). Counted
        here, not read off the attention cache: a convolution-only layer (``lightconv``,
        ``dynamicconv``) has none, and reading 0 put every new token at position 0."""
        return self.seen


class LSRAAttention(AttentionPart):
    """x (B, T, D) -> concat(attention(x[..., :a]), conv(x[..., a:])) (B, T, D).

    Submodules: ``attn`` (:class:`~effiformer.attention.dense.DenseAttention` of width ``a``,
    ``attn_heads`` heads; None when ``a == 0``) and ``conv``
    (:class:`~effiformer.attention.convolution.ConvBranch` of width ``D - a``; None when
    ``a == D``)."""

    def __init__(self, config: LSRAConfig, dims: AttentionDims) -> None:
        super().__init__()
        config = config.for_layer(dims.layer, dims.n_layers)
        self.config, self.dims = config, dims
        self.attn_dim, self.conv_dim = branch_widths(config, dims.dim)
        a, c = self.attn_dim, self.conv_dim
        self.attn = (
            DenseAttention(a, config.attn_heads, a // config.attn_heads, dropout=dims.dropout)
            if a
            else None
        )
        self.conv = (
            ConvBranch(
                c,
                kernel_size=config.kernel_size,
                heads=config.conv_heads,
                dynamic=config.conv == "dynamic",
                glu=config.glu,
                weight_softmax=config.weight_softmax,
                weight_dropout=config.weight_dropout,
                method=config.method,
            )
            if c
            else None
        )

    @classmethod
    def from_config(cls, config: LSRAConfig, dims: AttentionDims) -> LSRAAttention:
        return cls(config, dims)

    # ---- decoding state ---------------------------------------------------------------------

    def init_decoding_state(self, batch: int, *, device=None, dtype=None) -> LSRAState:
        """An empty KVCache for the attention branch and a zero buffer (R, K - 1, C) for the
        convolution (zeros are what a causal convolution sees before the first token)."""
        p = next(self.parameters())
        device = p.device if device is None else device
        dtype = p.dtype if dtype is None else dtype
        attn = (
            None
            if self.attn is None
            else self.attn.init_decoding_state(batch, device=device, dtype=dtype)
        )
        conv = None
        if self.conv is not None:
            k = self.conv.kernel_size
            conv = torch.zeros(batch, k - 1, self.conv_dim, device=device, dtype=dtype)
        return LSRAState(attn=attn, conv=conv)

    # ---- forward ----------------------------------------------------------------------------

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: LSRAState | None = None,
        positions: None = None,
    ) -> AttentionOutput:
        """x: (B, Tq, D) -> out (B, Tq, D): channels ``0 .. a-1`` from the attention branch,
        ``a .. D-1`` from the convolution branch.

        ``mask``: causal (the convolution is causal too) and key padding ((B, Tk): the attention
        branch masks those keys, the convolution zeroes those inputs; with a state, its last
        ``Tq`` columns are the new positions). ``state``: an :class:`LSRAState` for causal
        incremental decoding (from :meth:`init_decoding_state`); the next one is returned."""
        if kv is not None:
            raise ValueError(
                "LSRA is self-attention: its convolution branch runs over x, so it takes no kv "
                "(memory or pooled queries)"
            )
        if state is not None and not isinstance(state, LSRAState):
            raise ValueError(f"LSRA's state is an LSRAState or None, got {type(state).__name__}")
        causal = mask is not None and mask.causal
        if state is not None and not causal:
            raise ValueError("an LSRA decoding state needs a causal mask (decoder self-attention)")
        check_attention_inputs(
            x, None, self.dims.dim, mask, past=0 if state is None else state.length
        )
        a = self.attn_dim
        outs, attn_state, conv_state = [], None, None
        if self.attn is not None:
            o = self.attn(x[..., :a], mask=mask, state=None if state is None else state.attn)
            outs.append(o.out)  # (B, Tq, a)
            attn_state = o.state
        if self.conv is not None:
            keep = None
            if mask is not None and mask.key_padding is not None:
                keep = mask.key_padding[:, -x.shape[1] :].to(torch.bool)  # (B, Tq)
            y, conv_state = self.conv(
                x[..., a:], causal=causal, keep=keep, buffer=None if state is None else state.conv
            )
            outs.append(y)  # (B, Tq, D - a)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)  # (B, Tq, D)
        new_state = (
            None
            if state is None
            else LSRAState(attn=attn_state, conv=conv_state, seen=state.seen + x.shape[1])
        )
        return AttentionOutput(out=out, state=new_state)

    # ---- cost -------------------------------------------------------------------------------

    @classmethod
    def mult_adds(cls, config, dims, tq, tk, *, taps=False) -> int:
        """Attention branch (dense, width ``a``) + convolution branch: input linear ``C x C``
        (``C x 2C`` with GLU), output linear ``C x C``, the dynamic kernel generator
        ``C x H*K``; with ``taps`` the depthwise taps, ``C * K`` per position."""
        config = config.for_layer(dims.layer, dims.n_layers)
        a, c = branch_widths(config, dims.dim)
        total = 0
        if a:
            h = config.attn_heads
            sub = AttentionDims(a, h, a // h, causal=dims.causal)
            total += DenseAttention.mult_adds(DenseConfig(), sub, tq, tk)
        if c:
            k = config.kernel_size
            total += tq * c * (2 * c if config.glu else c) + tq * c * c
            if config.conv == "dynamic":
                total += tq * c * config.conv_heads * k
            if taps:
                total += tq * c * k
        return total

    # ---- testing hooks ----------------------------------------------------------------------

    @classmethod
    def example_config(cls, config: LSRAConfig, seq_len: int) -> LSRAConfig:
        """Kernel of 7 taps (well inside the sequence); for ``lsra`` itself the dynamic GLU
        branch (the WMT layout), so the contract covers both convolutions (``lightconv`` keeps
        its lightweight one)."""
        k = max(1, min(7, seq_len // 4))
        if type(config) is LSRAConfig:
            return dataclasses.replace(config, kernel_sizes=(k,), conv="dynamic", glu=True)
        return dataclasses.replace(config, kernel_sizes=(k,))

    @classmethod
    def degenerate_config(cls, config: LSRAConfig, seq_len: int) -> LSRAConfig:
        """Every channel to the attention branch: plain dense attention of ``attn_heads`` heads."""
        return dataclasses.replace(config, attention_fraction=1.0)

    def dense_reference(
        self, x: Tensor, *, kv: Tensor | None = None, mask: AttentionMask | None = None
    ) -> Tensor:
        """Dense softmax attention with the attention branch's projections over its channels,
        zeros for the convolution's (what the layer computes without its convolution branch):
        at ``attention_fraction=1`` plain dense attention of the whole width."""
        a = self.attn_dim
        out = x.new_zeros(x.shape)
        if self.attn is None:
            return out
        h = self.attn.n_heads
        dh = self.attn.head_dim
        xa = x[..., :a]

        def heads(t: Tensor) -> Tensor:
            return t.view(t.shape[0], t.shape[1], h, dh).transpose(1, 2)  # (B, H, T, Dh)

        q, k, v = (
            heads(self.attn.q_proj(xa)),
            heads(self.attn.k_proj(xa)),
            heads(self.attn.v_proj(xa)),
        )
        keep = None if mask is None else mask.to_bool(x.shape[1], x.shape[1], device=x.device)
        o = reference_attention(q, k, v, keep)  # (B, H, T, Dh)
        out[..., :a] = self.attn.o_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], a))
        return out


register_attention(
    "lsra",
    LSRAConfig,
    LSRAAttention,
    description="Lite Transformer: attention on half the channels, convolution on the other",
)
register_attention(
    "lightconv",
    LightConvConfig,
    LSRAAttention,
    description="lightweight convolution instead of attention (Wu et al. 2019)",
)
register_attention(
    "dynamicconv",
    DynamicConvConfig,
    LSRAAttention,
    description="dynamic convolution instead of attention (Wu et al. 2019)",
)
