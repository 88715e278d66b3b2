"""The one attention interface every mechanism implements (see docs/design.md).

An attention module is an ``nn.Module`` whose ``forward`` has this signature::

    forward(x, *, kv=None, mask=None, state=None, positions=None) -> AttentionOutput

- ``x``: (B, Tq, D) hidden states the queries come from.
- ``kv``: (B, Tk, D) hidden states keys and values come from; ``None`` means ``x``
  (self-attention). Funnel's pooled-query layer passes the pooled state as ``x`` and the unpooled
  one as ``kv``; cross-attention passes the encoder output.
- ``mask``: :class:`AttentionMask` — causal flag and key padding. Queries are aligned to the *last*
  ``Tq`` key positions (query ``i`` sees key ``j`` iff ``j <= i + Tk - Tq`` when causal), which is
  what recurrent memory needs.
- ``state``: the mechanism's explicit recurrent state (Transformer-XL memory, Compressive memories,
  Adaptive-Span cache, a decoding cache), or ``None``. Never stored on the module.
- ``positions``: mechanism-specific positional inputs computed once per forward by the model and
  shared by layers (relative encodings, Funnel's position/segment structures), or ``None``.

It returns :class:`AttentionOutput`: the output (B, Tq, D), the new state, auxiliary losses by
name (added to the task loss by the trainer), and ``updates`` — tensors computed under
``no_grad`` that the trainer writes into buffers after the optimiser step (Routing's k-means).

Registered parts (:mod:`effiformer.attention.registry`) subclass :class:`AttentionPart`:

- built by ``cls.from_config(config, dims)`` from their frozen
  :class:`~effiformer.config.AttentionConfig` and the model's :class:`AttentionDims`;
- ``prepare(ctx, shared)`` runs **once per model forward** for every group of layers with the
  same ``prepare_key()`` (by default: same class and config) and the same query/key lengths;
  its result reaches every layer of the group as ``positions``. It holds what layers share and
  what is drawn at random for the forward: block masks, relative-position tables, hash
  rotations. ``shared`` is the group's module from ``cls.build_shared(config, dims)`` (parameters
  shared by the layers, e.g. Transformer-XL's tied u/v), or ``None``.

**Determinism contract.** A layer's forward is a function of its inputs (``x``, ``kv``,
``mask``, ``state``, ``positions``), its parameters and the torch RNG state at the call (dropout)
-- nothing else: no module attribute set by an earlier call, no hidden counter. Randomness that
must stay fixed across a forward and its recomputation (LSH rotations) is drawn in ``prepare``,
from ``ctx.generator`` when one is given, and travels in ``positions``. So a reversible or
checkpointed stack that restores the RNG state and passes the same prepared inputs re-runs a
layer exactly. ``updates`` computed during a recomputation are discarded by the stack. A part
whose forward makes discrete choices from its inputs (LSH buckets) returns them in
``AttentionOutput.replay``; a stack that re-runs the layer on *reconstructed* inputs (the
reversible stack) passes that back as ``positions``, so rounding cannot change the choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..config import AttentionConfig
from ..ops.reference import reference_attention

__all__ = [
    "AttentionConfig",
    "AttentionDims",
    "AttentionMask",
    "AttentionOutput",
    "AttentionPart",
    "KVCache",
    "PrepareContext",
    "check_attention_inputs",
    "dense_bool_mask",
    "keep_init",
    "keeps_init",
    "map_tensors",
    "reference_attention",
]


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see.

    causal: query ``i`` (of ``Tq``) sees key ``j`` (of ``Tk``) iff ``j <= i + (Tk - Tq)``.
    key_padding: (B, Tk) bool, ``True`` for real tokens, ``False`` for padding; or ``None``.
    """

    causal: bool = False
    key_padding: Tensor | None = None

    def to_bool(self, tq: int, tk: int, device: torch.device | None = None) -> Tensor | None:
        """Boolean keep-mask broadcastable to (B, H, Tq, Tk), or ``None`` if nothing is masked."""
        return dense_bool_mask(
            tq, tk, causal=self.causal, key_padding=self.key_padding, device=device
        )


def dense_bool_mask(
    tq: int,
    tk: int,
    *,
    causal: bool,
    key_padding: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor | None:
    """Keep-mask (True = attend) of shape (1 or B, 1, Tq, Tk); ``None`` when nothing is masked."""
    mask = None
    if causal:
        offset = tk - tq
        qi = torch.arange(tq, device=device)[:, None]
        kj = torch.arange(tk, device=device)[None, :]
        mask = (kj <= qi + offset)[None, None]  # (1, 1, Tq, Tk)
    if key_padding is not None:
        kp = key_padding[:, None, None, :].to(torch.bool)  # (B, 1, 1, Tk)
        mask = kp if mask is None else (mask & kp)
    return mask


@dataclass
class AttentionOutput:
    """What every attention module (and every block) returns.

    out: (B, Tq, D).
    state: the new explicit state (same structure the module accepts), or ``None``.
    aux: auxiliary losses by name, each a scalar tensor, added to the task loss.
    updates: tensors computed without gradient that the training loop applies to buffers after
        the optimiser step, keyed by the buffer's qualified name relative to the module.
    replay: what re-runs this call exactly when passed back as ``positions`` in a recomputation
        (a reversible stack's backward): the call's discrete choices, such as LSH buckets, so
        that inputs reconstructed up to rounding cannot flip them. ``None``: re-run with the
        prepared ``positions``.
    """

    out: Tensor
    state: Any = None
    aux: dict[str, Tensor] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)
    replay: Any = None


@dataclass(frozen=True)
class KVCache:
    """A decoding cache: the projected keys and values so far, (B, H, T, Dh) each.

    An attention part that supports incremental decoding takes ``state=KVCache`` (start from
    :meth:`empty`), attends over ``cache ++ new`` keys (queries aligned to the last ``Tq`` keys,
    as every causal mask here) and returns the longer cache in ``AttentionOutput.state``.
    """

    k: Tensor
    v: Tensor

    @classmethod
    def empty(cls, batch: int, n_heads: int, head_dim: int, *, device=None, dtype=None) -> KVCache:
        z = torch.zeros(batch, n_heads, 0, head_dim, device=device, dtype=dtype)
        return cls(z, z)

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def extend(self, k: Tensor, v: Tensor) -> KVCache:
        return KVCache(torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2))


def map_tensors(obj: Any, fn) -> Any:
    """``fn`` applied to every tensor in a nest of tuples, lists, dicts and dataclasses (decoding
    states); everything else is returned as is. Frozen dataclasses are rebuilt with
    ``dataclasses.replace``."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(o, fn) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)
    return obj


def check_attention_inputs(
    x: Tensor, kv: Tensor | None, dim: int, mask: AttentionMask | None, *, past: int = 0
) -> None:
    """Validate shapes at the attention boundary with errors that name the argument. ``past``:
    keys already in a decoding cache (they count towards Tk)."""
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"attention input x must be (B, Tq, {dim}), got {tuple(x.shape)}")
    if kv is not None:
        if kv.dim() != 3 or kv.shape[-1] != dim or kv.shape[0] != x.shape[0]:
            raise ValueError(
                f"attention input kv must be (B={x.shape[0]}, Tk, {dim}), got {tuple(kv.shape)}"
            )
        if kv.dtype != x.dtype:
            raise ValueError(f"x and kv must share a dtype, got {x.dtype} and {kv.dtype}")
    tk = (kv if kv is not None else x).shape[1] + past
    if mask is not None and mask.key_padding is not None:
        kp = mask.key_padding
        if kp.shape != (x.shape[0], tk):
            raise ValueError(
                f"mask.key_padding must be (B={x.shape[0]}, Tk={tk}), got {tuple(kp.shape)}"
            )
    if mask is not None and mask.causal and tk < x.shape[1]:
        raise ValueError(f"causal attention needs Tk >= Tq, got Tq={x.shape[1]}, Tk={tk}")


@dataclass(frozen=True)
class AttentionDims:
    """What the model tells a mechanism when it builds one layer's attention.

    dim: model width D; n_heads: H; head_dim: Dh; causal: whether the model is causal (the part
    refuses a mode it does not support); dropout: attention-weight dropout (``attn_dropout``);
    residual_dropout: the model's ``dropout`` (Transformer-XL applies it to R, Funnel to its
    sinusoids); layer / n_layers: this layer's index and the depth (patterns that vary by layer);
    max_len: the longest sequence a forward accepts (``seq_len``).
    """

    dim: int
    n_heads: int
    head_dim: int
    causal: bool
    dropout: float = 0.0
    residual_dropout: float = 0.0
    layer: int = 0
    n_layers: int = 1
    max_len: int | None = None

    @property
    def inner_dim(self) -> int:
        return self.n_heads * self.head_dim


@dataclass
class PrepareContext:
    """What ``prepare`` sees: one model forward's shapes, mask and randomness.

    tq / tk: query and key lengths; mask: the forward's :class:`AttentionMask`; device / dtype:
    of the hidden states; training: the model's mode; memory_len: the memory a query may reach
    beyond the current segment as configured (0 without memory; Transformer-XL's ``same_length``
    window); q_positions (Tq,) / k_positions (Tk,): absolute positions of the queries and keys
    (``None``: keys ``0 .. Tk-1`` and queries aligned to the last ``Tq`` of them); generator: an
    explicit ``torch.Generator`` for stochastic preparation (``None``: the global RNG); extra:
    model-specific structure a family's own attention reads (Funnel: token types, [CLS]);
    scratch: a dict shared by every ``prepare`` call of one model forward (a table drawn once
    and indexed by several groups).
    """

    tq: int
    tk: int
    mask: AttentionMask
    device: torch.device
    dtype: torch.dtype
    training: bool = False
    memory_len: int = 0
    q_positions: Tensor | None = None
    k_positions: Tensor | None = None
    generator: torch.Generator | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    scratch: dict[Any, Any] = field(default_factory=dict)

    def query_positions(self) -> Tensor:
        if self.q_positions is not None:
            return self.q_positions
        return torch.arange(self.tk - self.tq, self.tk, device=self.device)

    def key_positions(self) -> Tensor:
        if self.k_positions is not None:
            return self.k_positions
        return torch.arange(self.tk, device=self.device)


def keep_init(p: nn.Parameter) -> nn.Parameter:
    """Mark ``p`` as initialised by the part that owns it: the models' weight-init loops
    (N(0, 0.02) matrices, zero biases) leave it as it is. For parameters whose initialisation is
    part of the mechanism (Adaptive Span's random-normal position embedding, its span parameters
    set to ``init_span``). Returns ``p``."""
    p._effiformer_keep_init = True  # type: ignore[attr-defined]
    return p


def keeps_init(p: Tensor) -> bool:
    """Whether a model's init loop must skip ``p`` (see :func:`keep_init`)."""
    return bool(getattr(p, "_effiformer_keep_init", False))


class AttentionPart(nn.Module):
    """Base class of registered attention mechanisms (see the module docstring).

    Subclasses implement ``forward`` (the interface above) and, where they need them,
    ``from_config``, ``build_shared``, ``prepare``, ``memory_len``; the testing hooks
    (``example_config``, ``causal_config``, ``degenerate_config``, ``make_dense_equivalent_``,
    ``dense_reference``)
    let the registry-wide contract test (``tests/attention/test_contract.py``) run each mechanism
    at a size that exercises it and check it against dense attention at its degenerate limit.
    """

    config: AttentionConfig
    dims: AttentionDims

    @classmethod
    def from_config(cls, config: AttentionConfig, dims: AttentionDims) -> AttentionPart:
        module = cls(config, dims)  # type: ignore[call-arg]
        module.config, module.dims = config, dims
        return module

    @classmethod
    def build_shared(cls, config: AttentionConfig, dims: AttentionDims) -> nn.Module | None:
        """A module shared by every layer of a group (its parameters trained once), or None."""
        return None

    def prepare_key(self) -> Hashable:
        """Layers with equal keys share one ``prepare`` result and one shared module."""
        return (type(self), self.config)

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> Any:
        """Computed once per forward for this layer's group; handed to ``forward`` as
        ``positions``. Default: nothing to prepare."""
        return None

    # A part may define ``after_optimizer_step(self) -> None``: the trainer calls it on every
    # module after each optimiser step (parameter constraints such as Adaptive Span's clamp).

    # ---- incremental decoding ---------------------------------------------------------------

    def init_decoding_state(
        self, batch: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Any:
        """The state causal incremental decoding starts from (nothing fed yet).

        A part that supports decoding returns it here and, called with ``state=``, attends over
        everything fed since (queries aligned to the last keys, as every causal mask here) and
        returns the next state in ``AttentionOutput.state``: dense attention a
        :class:`KVCache`, a convolution branch its buffer of past inputs. Every tensor in a
        decoding state keeps the batch rows on dim 0, so :meth:`reorder_decoding_state` can pick
        rows (beam search). Default: this part cannot decode incrementally."""
        raise NotImplementedError(
            f"attention {getattr(self.config, 'name', type(self).__name__)!r} has no incremental "
            "decoding state (init_decoding_state); generation needs a causal self-attention that "
            "implements it, e.g. 'dense'"
        )

    def reorder_decoding_state(self, state: Any, index: Tensor) -> Any:
        """The decoding state of rows ``index`` (R',) of ``state``, in that order (beam search
        keeps the best continuations). Default: ``index_select(0, index)`` on every tensor."""
        return map_tensors(state, lambda t: t.index_select(0, index))

    @classmethod
    def mult_adds(
        cls,
        config: AttentionConfig,
        dims: AttentionDims,
        tq: int,
        tk: int,
        *,
        taps: bool = False,
    ) -> int | None:
        """Multiply-accumulates of one forward of a layer of this part (built from ``config``,
        already resolved for its layer, and ``dims``) for ``tq`` queries over ``tk`` keys, batch
        1: those of its matmuls (projections, scores, weighted sums; a convolution's taps only
        when ``taps``), not of softmax, norms, biases or masks. Every query counts against every
        key, masked or not, as a profiler of the teacher-forced matmuls counts them. ``None``:
        this part does not say (the analytic counter, :mod:`effiformer.flops`, then reports the
        model's count as unknown). Default: ``None``."""
        return None

    def memory_len(self, configured: int) -> int:
        """How many past states this layer's memory keeps, given the model's configured
        ``mem_len`` (Adaptive Span keeps only what its current span can reach)."""
        return configured

    def own_clip_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradient scale the mechanism sets, not the task, and which the
        trainer therefore clips as a group of their own (:func:`effiformer.train.clip_gradients`)
        instead of inside the model's global norm: Adaptive Span's span ratios, whose gradient
        carries the factor S / R of its soft mask (128 at S = 4,096, R = 32) and would
        otherwise own the global norm and scale every other weight's step down with it (the
        paper clips each parameter on its own). Default: none."""
        return []

    # ---- testing hooks ------------------------------------------------------------------

    @classmethod
    def example_config(cls, config: AttentionConfig, seq_len: int) -> AttentionConfig:
        """A config of this mechanism that really exercises it on sequences of ``seq_len``
        (windows, chunks and buckets smaller than the sequence): what the contract test runs.
        Default: ``config`` (the registered defaults)."""
        return config

    @classmethod
    def causal_config(cls, config: AttentionConfig, seq_len: int) -> AttentionConfig | None:
        """A config of this mechanism (derived from ``config``, the example config) under which a
        causal layer's outputs before position ``t`` are exactly unchanged by tokens at ``t`` and
        later: what the contract test's causality check runs. Default: ``config``.

        A mechanism whose *selection* of keys competes over the whole segment (Routing's
        balanced top-w clusters, as in its official training code) returns one whose selection
        is trivial, and tests its masks on its own. ``None`` for a mechanism that is causal in
        its attention weights only (Reformer LSH: a later token's hash moves it in the sort
        order, which changes which earlier keys share a chunk); such a part tests its weights in
        its own tests."""
        return config

    @classmethod
    def degenerate_config(cls, config: AttentionConfig, seq_len: int) -> AttentionConfig:
        """A config of this mechanism that computes dense attention on sequences of
        ``seq_len`` (one bucket, one cluster, window >= length, ...)."""
        return config

    def make_dense_equivalent_(self) -> None:
        """Set parameters so that the degenerate config equals dense attention (e.g. zero a
        relative-position projection). Default: nothing to set."""

    def dense_reference(
        self, x: Tensor, *, kv: Tensor | None = None, mask: AttentionMask | None = None
    ) -> Tensor:
        """Dense softmax attention with this module's own projections (``q_proj``, ``k_proj``,
        ``v_proj``, ``o_proj``): what the degenerate configuration must equal. (B, Tq, D)."""
        src = x if kv is None else kv
        h, dh = self.dims.n_heads, self.dims.head_dim

        def heads(t: Tensor) -> Tensor:
            return t.view(t.shape[0], t.shape[1], h, dh).transpose(1, 2)  # (B, H, T, Dh)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(src)), heads(self.v_proj(src))
        keep = None if mask is None else mask.to_bool(x.shape[1], src.shape[1], device=x.device)
        o = reference_attention(q, k, v, keep)  # (B, H, Tq, Dh)
        return self.o_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], h * dh))
