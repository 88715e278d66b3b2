"""Compression functions f_c of the Compressive Transformer.

Rae, Potapenko, Jayakumar, Hillier, Lillicrap 2019, "Compressive Transformers for Long-Range
Sequence Modelling", arXiv 1911.05507, sec. 3.1 ("Choice of compression functions"): f_c maps the
``n_s`` states evicted from the memory to ``floor(n_s / c)`` compressed states, with

- ``max`` / ``mean``: max or mean pooling with kernel = stride = c;
- ``conv``: a 1-D convolution with kernel = stride = c (the paper's best, and our default);
- ``dilated_conv``: a dilated 1-D convolution;
- ``most_used``: keep the memories that received the most attention, in their temporal order.

Every f_c here maps ``old_mem`` (B, N, D) to (B, N // c, D). Deliberate choices, not fixed by
the paper:

- When ``N`` is not a multiple of ``c`` (the paper assumes it is) the oldest ``N mod c`` evicted
  states are dropped, so compressed slots align with the most recent eviction boundary (the
  lucidrains reimplementation instead zero-pads the evicted block on the left).
- ``dilated_conv`` (the paper gives no kernel or dilation): a WaveNet-style stack of
  ``ceil(log2 c)`` causal convolutions with kernel 2 and dilations 1, 2, 4, ..., then the output
  at the last state of every group of ``c``. Each compressed slot's receptive field (``2^L >= c``
  states) covers its whole group (exactly, when ``c`` is a power of two); linear, like ``conv``.
- ``most_used``: "usage" is the attention weight a slot received (summed over heads and queries)
  in the last segment it sat in the memory; :class:`~effiformer.models.compressive.Compressive`
  computes it with the layer's own attention weights. Ties keep the older slot.
- Convolutions use PyTorch's default initialisation.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .memory import check_memories, push_and_evict

__all__ = [
    "COMPRESSIONS",
    "CompressiveMemory",
    "Compression",
    "ConvCompression",
    "DilatedConvCompression",
    "MaxPoolCompression",
    "MeanPoolCompression",
    "MostUsedCompression",
    "build_compression",
]


class Compression(nn.Module):
    """Base: ``forward(old_mem (B, N, D), usage (B, N) | None) -> (B, N // rate, D)``."""

    needs_usage = False

    def __init__(self, rate: int) -> None:
        super().__init__()
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
            raise ValueError(f"compression rate must be a positive int, got {rate!r}")
        self.rate = rate

    def _aligned(self, old_mem: Tensor) -> Tensor:
        if old_mem.dim() != 3:
            raise ValueError(f"old_mem must be (B, N, D), got {tuple(old_mem.shape)}")
        r = old_mem.shape[1] % self.rate
        return old_mem[:, r:]  # (B, N - N mod c, D): drop the oldest remainder

    def forward(self, old_mem: Tensor, usage: Tensor | None = None) -> Tensor:
        x = self._aligned(old_mem)
        if usage is not None and usage.shape != old_mem.shape[:2]:
            raise ValueError(
                f"usage must be (B, N)={tuple(old_mem.shape[:2])}, got {tuple(usage.shape)}"
            )
        if x.shape[1] == 0:
            return x
        return self._compress(x, usage)

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        raise NotImplementedError


class MeanPoolCompression(Compression):
    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        y = F.avg_pool1d(x.transpose(1, 2), self.rate, self.rate)  # (B, D, N/c)
        return y.transpose(1, 2)  # (B, N/c, D)


class MaxPoolCompression(Compression):
    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        y = F.max_pool1d(x.transpose(1, 2), self.rate, self.rate)  # (B, D, N/c)
        return y.transpose(1, 2)  # (B, N/c, D)


class ConvCompression(Compression):
    def __init__(self, dim: int, rate: int) -> None:
        super().__init__(rate)
        self.conv = nn.Conv1d(dim, dim, kernel_size=rate, stride=rate)

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, D, N/c) -> (B, N/c, D)


class DilatedConvCompression(Compression):
    def __init__(self, dim: int, rate: int) -> None:
        super().__init__(rate)
        n_layers = math.ceil(math.log2(rate)) if rate > 1 else 0
        self.dilations = [2**i for i in range(n_layers)]
        self.convs = nn.ModuleList(
            nn.Conv1d(dim, dim, kernel_size=2, dilation=d) for d in self.dilations
        )

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        y = x.transpose(1, 2)  # (B, D, N)
        for d, conv in zip(self.dilations, self.convs):
            y = conv(F.pad(y, (d, 0)))  # causal: (B, D, N)
        return y[:, :, self.rate - 1 :: self.rate].transpose(1, 2)  # (B, N/c, D)


class MostUsedCompression(Compression):
    needs_usage = True

    def _compress(self, x: Tensor, usage: Tensor | None) -> Tensor:
        if usage is None:
            raise ValueError("most_used compression needs usage (B, N): attention per slot")
        usage = usage[:, usage.shape[1] - x.shape[1] :]  # (B, N'): drop the same remainder
        n_keep = x.shape[1] // self.rate
        # Stable descending sort keeps the older slot on ties; re-sort the kept indices by time.
        order = torch.sort(usage, dim=1, descending=True, stable=True).indices[:, :n_keep]
        idx = torch.sort(order, dim=1).values  # (B, N/c)
        return torch.gather(x, 1, idx[:, :, None].expand(-1, -1, x.shape[2]))  # (B, N/c, D)


COMPRESSIONS = ("conv", "max", "mean", "dilated_conv", "most_used")


def build_compression(kind: str, dim: int, rate: int) -> Compression:
    """A per-layer f_c by name (one of :data:`COMPRESSIONS`)."""
    if kind == "conv":
        return ConvCompression(dim, rate)
    if kind == "dilated_conv":
        return DilatedConvCompression(dim, rate)
    if kind == "mean":
        return MeanPoolCompression(rate)
    if kind == "max":
        return MaxPoolCompression(rate)
    if kind == "most_used":
        return MostUsedCompression(rate)
    raise ValueError(f"compression must be one of {list(COMPRESSIONS)}, got {kind!r}")


logger = logging.getLogger(__name__)
_warned_remainders: set[tuple[int, int]] = set()


class CompressiveMemory:
    """The Compressive Transformer's memory policy (Algorithm 1), for the layer stack.

    Per layer two FIFO queues, both initialised to zeros: a memory of ``mem_len`` (n_m) and a
    compressed memory of ``cmem_len`` (n_cm). Layer ``i`` attends over ``[cmem; mem; x]``; then
    ``x`` is pushed into the memory, the states pushed out are compressed by the layer's own f_c
    (``compressors[i]``, owned by the model) with rate ``rate`` and appended to the compressed
    memory. ``most_used`` asks the layer's attention for its weights
    (``attention_probs``) and the attention-reconstruction loss (Algorithm 2) uses its content
    attention (``content_attention``), so the layer's attention part must expose both
    (``relative_xl`` does). The loss, ``||attn(h, old_mem) - attn(h, f_c(old_mem))||_2`` with h,
    old_mem and the attention weights stop-gradiented, is returned per layer as
    ``attn_reconstruction`` when gradients are enabled and f_c has parameters.
    """

    def __init__(
        self, compressors: nn.ModuleList, *, mem_len: int, cmem_len: int, rate: int
    ) -> None:
        self.compressors, self.mem_len, self.cmem_len, self.rate = (
            compressors,
            mem_len,
            cmem_len,
            rate,
        )

    @property
    def window(self) -> int:
        return self.mem_len + self.cmem_len

    def check_blocks(self, blocks) -> None:
        for i, b in enumerate(blocks):
            attn = getattr(b, "attn", None)
            missing = [m for m in ("attention_probs", "content_attention") if not hasattr(attn, m)]
            if missing:
                raise ValueError(
                    f"the compressive memory needs an attention part exposing {' and '.join(missing)} "
                    f"(relative_xl does); layer {i}'s {type(attn).__name__} does not"
                )

    def init_state(self, blocks, batch, dim, device, dtype) -> tuple:
        return tuple(
            (
                torch.zeros(batch, self.mem_len, dim, device=device, dtype=dtype),
                torch.zeros(batch, self.cmem_len, dim, device=device, dtype=dtype),
            )
            for _ in blocks
        )

    full_state = init_state

    def check_state(self, state, n_layers, batch, dim, ref) -> tuple:
        return check_memories(state, n_layers, batch, dim, ref, per_layer=2)

    def keys(self, layer: int, block: nn.Module, x: Tensor, mem) -> Tensor:
        m, cm = mem
        return torch.cat([cm, m, x], dim=1)  # (B, n_cm + n_m + T, D)

    def update(self, layer, block, x, kv, mem, *, mask, positions):
        m, cmem = mem
        f_c = self.compressors[layer]
        new_mem, old_mem = push_and_evict(m, x, self.mem_len)  # both detached
        n_old = old_mem.shape[1]
        if n_old % self.rate and (n_old, self.rate) not in _warned_remainders:
            _warned_remainders.add((n_old, self.rate))
            logger.warning(
                "%d evicted memories are not a multiple of compression_rate=%d: the oldest %d "
                "are dropped; use segments whose length is a multiple of the rate",
                n_old,
                self.rate,
                n_old % self.rate,
            )
        usage = None
        if f_c.needs_usage and n_old:
            with torch.no_grad():
                probs = block.attn.attention_probs(
                    block.attention_input(x, stop_gradient=True),
                    kv=block.attention_input(kv, stop_gradient=True),
                    mask=mask,
                    positions=positions,
                )  # (B, H, T, Tk)
            cm = cmem.shape[1]
            usage = probs.sum(dim=(1, 2))[:, cm : cm + n_old]  # (B, n_old): old_mem's keys
        compressed = f_c(old_mem, usage)  # (B, n_old // c, D); grad reaches f_c only
        aux = {}
        trainable = any(p.requires_grad for p in f_c.parameters())
        if torch.is_grad_enabled() and trainable and compressed.shape[1]:
            h = block.attention_input(x.detach(), stop_gradient=True)
            target = block.attn.content_attention(
                h, block.attention_input(old_mem, stop_gradient=True)
            )
            pred = block.attn.content_attention(
                h, block.attention_input(compressed, stop_gradient=True)
            )
            aux["attn_reconstruction"] = torch.linalg.vector_norm(target - pred)
        cat = torch.cat([cmem, compressed.detach()], dim=1)  # (B, n_cm + n_old // c, D)
        new_cmem = cat[:, max(0, cat.shape[1] - self.cmem_len) :]
        return (new_mem, new_cmem), aux
