"""Angular LSH attention with shared queries and keys: the Reformer's attention.

Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer", arXiv 2001.04451, sec. 2-3,
following the official trax code (``trax/layers/research/efficient_attention.py``,
``LSHSelfAttention``, ``hash_vecs``, ``attend``, ``mask_self_attention``).

Implemented, per head:

- **Shared QK** (sec. 2, "Shared-QK Transformer"): one projection gives the vectors ``q`` that are
  hashed and used as queries; the keys are ``q`` normalised to unit length. Exactly as trax's
  ``attend``: ``k = q / sqrt(mean(q^2) + 1e-6) / sqrt(Dh)`` (an RMS norm, then 1/sqrt(Dh), which
  makes ``|k| ~= 1``), and the logits are ``q . k`` with **no further 1/sqrt(Dh)**: the query's
  norm acts as a learned temperature. Values have their own projection; no biases (trax default).
- **Angular LSH** (sec. 2, eq. 3 of the paper; Andoni et al. 2015): per round ``r`` a Gaussian
  matrix ``R_r`` of shape (Dh, b/2); bucket = argmax([qR_r ; -qR_r]), ``b`` even. The default
  bucket count is trax's: ``b = 2 * max(1, L // chunk_len)`` (an average bucket is half a chunk),
  factorised above 128 into two even factors ``[b1, b2]`` (``b1 = 2**ceil(log2(sqrt(b)))``, bucket
  ``= h1 + b1 * h2``, the "hierarchical" hashing of ``hash_vecs``); ``n_buckets`` may give an even
  int or a tuple of even factors. Rotations are drawn in :meth:`LSHAttention.prepare` (once per
  model forward, from ``ctx.generator`` or the global RNG), so they are **resampled every forward
  pass**, and travel in ``positions``. No gradient flows through the hashing.
- **Sort** (sec. 2 "LSH attention"): each round's buckets are sorted stably by (bucket, position)
  -- trax's key ``L * bucket + position`` -- and the rounds are concatenated (round ``r`` fills
  slots ``r*L .. (r+1)*L - 1`` of the sorted stream), with the inverse permutation kept to unsort.
- **Chunks**: the sorted stream is cut into chunks of ``chunk_len``; each chunk attends to itself
  and ``n_chunks_before`` previous chunks (``n_chunks_after`` later ones), **circularly** across
  the whole stream as trax's ``look_adjacent`` (chunk 0 of round 0 sees the last chunk of the last
  round). As in current trax and HF, keys of other buckets inside a chunk are not masked.
- **Masks on original positions**, added to the logits as trax does (subtracted, never ``-inf``):
  causal (key position > query position) ``-1e9``, padding ``-1e9``, and the key at the query's own
  position ``-1e5``, so a token attends to itself only when nothing else is visible (the first
  token of a causal sequence). Padding tokens get a bucket of their own (the last, trax's extra
  bucket), so their content never moves real tokens in the sort.
- **Rounds combined** by their logsumexp weights (sec. 2 "Multi-round LSH attention"):
  ``o = sum_r exp(lse_r - logsumexp_r lse_r) o_r``. With ``duplicate_correction=True`` the paper's
  correction is applied: every logit of a pair (i, j) is lowered by ``log N_ij``, where ``N_ij``
  counts how many times key j appears in the windows of query i's copies over all rounds, so a
  key met in several rounds (or twice in one window) is counted once (the paper's eq. with
  ``m_ij = log N_ij``; trax's first enwik8 config, lucidrains' ``allow_duplicate_attention=False``;
  current trax and HF omit it: our default).

Cost: hashing O(L * Dh * b), the sort O(n_hashes * L log L), attention
O(n_hashes * L * (1 + before + after) * chunk_len * Dh); memory O(n_hashes * L * (Dh + chunk)) and
never a (L, L) tensor. The chunked attention is one custom autograd function
(:class:`_LSHCore`): the forward keeps only q, k, v, the combined output and one logsumexp per
sorted slot; the backward recomputes each block of chunks (flash-attention style), so the
(slots, window) logits are never stored for the backward pass. A round's gradient needs no
separate logsumexp path: with ``G_r = w_r * dO`` and the *combined* output ``o``,
``dS = P (dP - rowsum(G_r * o))`` already contains the gradient through the round weights.

Deviations / choices:

- Sequences that are not a multiple of ``chunk_len`` are padded at the end with padding tokens
  (their own bucket, masked); a sequence shorter than ``chunk_len`` uses one chunk of its own
  length. (trax requires ``L % chunk_len == 0``; HF silently runs full attention when
  ``L <= chunk_len``.)
- Rotations are drawn per layer and per head and shared across the batch (HF's choice); trax
  draws them per head and per example. A layer group's ``prepare`` is per layer
  (:meth:`LSHAttention.prepare_key` includes the layer index), so every layer has independent
  rotations.
- Attention dropout drops individual weights; trax broadcasts one (chunk, window) mask across
  chunks to save memory. Output dropout is the block's residual dropout.
- For reversible stacks the forward returns its buckets in ``AttentionOutput.replay``; passing
  that back as ``positions`` re-runs the layer on the same buckets (trax keeps them in the layer
  state, HF passes ``buckets``), so a reconstructed input that differs in the last bit cannot
  flip a hash.
- Changing a later token can change earlier *outputs* (its new hash moves it in the sort and so
  changes which earlier keys share a chunk); causality holds for the attention weights, which are
  exactly 0 on later positions (see ``tests/attention/test_lsh.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import AttentionConfig, ConfigError
from ..ops.flash_cpu import flash_backward, flash_forward, flash_unavailable
from .base import (
    AttentionDims,
    AttentionMask,
    AttentionOutput,
    AttentionPart,
    PrepareContext,
    check_attention_inputs,
)
from .registry import register_attention

__all__ = [
    "LSHConfig",
    "LSHAttention",
    "LSHPlan",
    "default_bucket_factors",
    "hash_vectors",
    "sort_buckets",
    "lsh_attention",
    "lsh_attention_weights",
    "shared_qk_keys",
    "shared_qk_reference",
    "with_n_hashes",
    "CAUSAL_MASK_VALUE",
    "SELF_MASK_VALUE",
]

#: Added (negated) to the logits of keys a query may not see: trax's ``mask_self_attention``.
CAUSAL_MASK_VALUE = 1e9
#: Added (negated) to the logit of the key at the query's own position.
SELF_MASK_VALUE = 1e5


@dataclass(frozen=True, kw_only=True)
class LSHConfig(AttentionConfig):
    """``chunk_len``: chunk of the sorted stream; ``n_hashes``: hashing rounds (a runtime
    setting: it changes no weights, see :func:`with_n_hashes`); ``n_buckets``: buckets per round
    (an even int, a tuple of even factors, or ``None``: ``2 * L // chunk_len``, factorised above
    128, as trax); ``n_chunks_before`` / ``n_chunks_after``: neighbouring chunks each chunk
    attends to (circularly); ``duplicate_correction``: subtract ``log N_ij`` for keys met
    several times (the paper's correction); ``bias``: biases on the projections."""

    name = "lsh"

    chunk_len: int = 128
    n_hashes: int = 1
    n_buckets: int | tuple[int, ...] | None = None
    n_chunks_before: int = 1
    n_chunks_after: int = 0
    duplicate_correction: bool = False
    bias: bool = False

    def __post_init__(self) -> None:
        self._check_positive("chunk_len")
        self._check_positive("n_hashes")
        for name in ("n_chunks_before", "n_chunks_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"attention.{name} must be an integer >= 0, got {v!r}")
        nb = self.n_buckets
        if isinstance(nb, list):
            nb = tuple(nb)
            object.__setattr__(self, "n_buckets", nb)
        if nb is not None:
            factors = (nb,) if isinstance(nb, int) and not isinstance(nb, bool) else nb
            if (
                not isinstance(factors, tuple)
                or not factors
                or any(
                    isinstance(f, bool) or not isinstance(f, int) or f < 2 or f % 2 for f in factors
                )
            ):
                raise ConfigError(
                    "attention.n_buckets must be None, an even int >= 2 or a tuple of even ints "
                    f">= 2 (factorised buckets), got {self.n_buckets!r}"
                )
        if not isinstance(self.duplicate_correction, bool):
            raise ConfigError(
                f"attention.duplicate_correction must be a bool, got {self.duplicate_correction!r}"
            )


def default_bucket_factors(length: int, chunk_len: int) -> tuple[int, ...]:
    """trax's ``hash_vectors`` default: ``2 * max(1, length // chunk_len)`` buckets, factorised
    into ``(2**ceil(log2(sqrt(b))), 2 * (b // (2 * that)))`` when above 128."""
    n = 2 * max(1, length // chunk_len)
    if n <= 128:
        return (n,)
    div = 2 ** math.ceil(math.log2(math.sqrt(n)))
    return (div, 2 * (n // (2 * div)))


@dataclass(frozen=True)
class LSHPlan:
    """One layer's prepared inputs for one forward (see :meth:`LSHAttention.prepare`).

    length / chunk / padded: the sequence length T, the chunk length used (``min(chunk_len, T)``)
    and T rounded up to chunks; factors: bucket factors (their product is the bucket count, the
    padding bucket is one more); rotations: (H, Dh, n_hashes, sum(factors) // 2) float32;
    buckets: (B, H, n_hashes, padded) int, filled by a forward for its replay (``None`` in a
    prepared plan).
    """

    length: int
    chunk: int
    padded: int
    factors: tuple[int, ...]
    rotations: Tensor
    buckets: Tensor | None = None

    @property
    def n_buckets(self) -> int:
        return math.prod(self.factors)


def shared_qk_keys(q: Tensor, eps: float = 1e-6) -> Tensor:
    """trax ``attend``'s keys for shared QK: ``q`` RMS-normalised, then divided by sqrt(Dh)
    (unit length up to ``eps``). (..., Dh) -> (..., Dh)."""
    return q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) / math.sqrt(q.shape[-1])


@torch.no_grad()
def hash_vectors(q: Tensor, rotations: Tensor, factors: tuple[int, ...]) -> Tensor:
    """Angular LSH buckets: q (B, H, L, Dh), rotations (H, Dh, n_hashes, sum(factors) // 2) ->
    (B, H, n_hashes, L) long in ``[0, prod(factors))``: per factor ``f``,
    ``argmax([qR_f ; -qR_f])``, combined as ``h_1 + f_1 * h_2 + f_1 f_2 * h_3 ...``. One round
    at a time, and the argmax over ``[x; -x]`` without building it (ties resolve as argmax
    would: the first maximum)."""
    rotations = rotations.to(q.dtype)
    rounds = []
    for r in range(rotations.shape[2]):
        rot = torch.einsum("bhtd,hdk->bhtk", q, rotations[:, :, r])  # (B, H, L, rot/2)
        buckets, start, scale = None, 0, 1
        for f in factors:
            rv = rot[..., start : start + f // 2]
            start += f // 2
            hi, hi_at = rv.max(dim=-1)
            lo, lo_at = rv.min(dim=-1)
            h = torch.where(hi >= -lo, hi_at, lo_at + f // 2)  # (B, H, L)
            buckets = h if buckets is None else buckets + scale * h
            scale *= f
        rounds.append(buckets)
    return torch.stack(rounds, dim=2)


def sort_buckets(buckets: Tensor) -> tuple[Tensor, Tensor]:
    """Stable sort of each round by (bucket, position).

    buckets: (B, H, n_hashes, L) -> ``(positions, slots)``: ``positions`` (B, H, n_hashes * L):
    the original position at each slot of the sorted stream (round r fills slots
    ``r*L .. (r+1)*L - 1``); ``slots`` (B, H, n_hashes, L): the slot of (round r, position p),
    the inverse permutation (``positions.gather(-1, slots.flatten(2)) == p``).
    """
    b, h, n, t = buckets.shape
    pos = torch.arange(t, device=buckets.device)
    key = buckets.long() * t + pos  # (B, H, n_h, L): trax's L * bucket + position
    order = torch.argsort(key, dim=-1, stable=True)  # (B, H, n_h, L) positions in sorted order
    offsets = (torch.arange(n, device=buckets.device) * t)[:, None]  # (n_h, 1)
    slots = torch.empty_like(order)
    slots.scatter_(-1, order, pos.expand_as(order).contiguous())
    slots = slots + offsets  # (B, H, n_h, L) global slot of (r, p)
    return order.reshape(b, h, n * t), slots


# ------------------------------------------------------------------------------- chunked core


#: Slots (per stream x streams) whose sorted outputs are combined together (a group of streams).
_GROUP_SLOTS = 1 << 16
#: Elements of one block of (chunk queries x window keys) logits.
_BLOCK_ELEMENTS = 1 << 21


def _mask_values(dtype: torch.dtype) -> tuple[float, float]:
    """(masked, self) logit offsets: trax's 1e9 / 1e5; HF's 1e4 / 1e3 in float16 (1e9
    overflows it)."""
    if dtype == torch.float16:
        return 1e4, 1e3
    return CAUSAL_MASK_VALUE, SELF_MASK_VALUE


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(frozen=True)
class _Layout:
    """Index tensors of one call, shared by the forward, the backward and the weights helper.

    The inputs are flat rows in the projections' own order, row ``(b * L + position) * H + h``
    (no transposing copies). bh: the B*H streams (stream ``b * H + h``), each of ``length``
    positions and ``n_hashes * length`` sorted slots; chunk / n_chunks: chunk length and chunks
    per stream; before / after: window chunks; q_rows (BH, S): flat row of each slot; undo
    (BH, n_h, L): slot (within its stream) of each (round, position); stream_rows (BH, L): flat
    row of each (stream, position); real (B*L,): key validity or ``None``; locs (rows, n_h):
    chunk of each (row, round), for the duplicate count, or ``None``.
    """

    bh: int
    heads: int
    length: int
    n_hashes: int
    chunk: int
    n_chunks: int
    before: int
    after: int
    causal: bool
    q_rows: Tensor
    undo: Tensor
    stream_rows: Tensor
    real: Tensor | None
    locs: Tensor | None

    @property
    def slots(self) -> int:
        return self.n_hashes * self.length

    @property
    def width(self) -> int:
        return self.before + 1 + self.after

    @property
    def window(self) -> int:
        return self.width * self.chunk

    def position(self, rows: Tensor) -> Tensor:
        """Flat rows -> their positions."""
        return (rows // self.heads) % self.length

    def ext_chunks(self) -> Tensor:
        """Chunk ids of the extended stream: the circular neighbours before and after."""
        ids = [n % self.n_chunks for n in range(-self.before, self.n_chunks + self.after)]
        return torch.tensor(ids, device=self.q_rows.device)

    def groups(self) -> Iterator[tuple[int, int]]:
        step = max(1, _GROUP_SLOTS // self.slots)
        for s0 in range(0, self.bh, step):
            yield s0, min(self.bh, s0 + step)

    def blocks(self, g: int) -> Iterator[tuple[int, int]]:
        per_chunk = g * self.chunk * self.window
        if self.locs is not None:
            per_chunk *= max(1, self.n_hashes * self.n_hashes * self.width // 4)
        step = max(1, _BLOCK_ELEMENTS // per_chunk)
        for a in range(0, self.n_chunks, step):
            yield a, min(self.n_chunks, a + step)


@dataclass
class _Group:
    """Streams ``s0 .. s1 - 1``: their slot rows, the extended (circular) key rows, and the
    positions the masks compare."""

    s0: int
    s1: int
    rows: Tensor  # (g, S) flat rows of the slots
    rows_ext: Tensor  # (g, (NC + before + after) * c) flat rows of the extended key stream
    qpos: Tensor  # (g, S) int64 query positions
    kpos_ext: Tensor  # (g, ext) int32 key positions; padded keys far in the future when causal
    kreal_ext: Tensor | None  # (g, ext) key validity (bidirectional models with padding)


def _group(lay: _Layout, s0: int, s1: int) -> _Group:
    g, nc, c, t = s1 - s0, lay.n_chunks, lay.chunk, lay.length
    rows = lay.q_rows[s0:s1]
    rows_ext = rows.view(g, nc, c)[:, lay.ext_chunks()].reshape(g, -1)
    kpos_ext = lay.position(rows_ext).to(torch.int32)
    kreal_ext = None
    if lay.real is not None:
        kreal_ext = lay.real[rows_ext // lay.heads]
        if lay.causal:  # a padded key is masked like a later one
            kpos_ext = torch.where(kreal_ext, kpos_ext, torch.full_like(kpos_ext, 2 * t + 1))
            kreal_ext = None
    return _Group(s0, s1, rows, rows_ext, lay.position(rows), kpos_ext, kreal_ext)


def _win(t_ext: Tensor, n: int, chunk: int, window: int) -> Tensor:
    """The windows of n chunks as a strided view: t_ext (g, (n + before + after) * c, ...) ->
    (g, n, W, ...) (chunk j's window is rows ``j*c .. j*c + W - 1``)."""
    st = t_ext.stride()
    return t_ext.as_strided(
        (t_ext.shape[0], n, window, *t_ext.shape[2:]),
        (st[0], chunk * st[1], st[1], *st[2:]),
        t_ext.storage_offset(),
    )


def _chunks(t: Tensor, lay: _Layout, a: int, b: int) -> Tensor:
    """(g, S, ...) -> chunks a .. b-1: (g, b-a, c, ...) view."""
    return t.view(t.shape[0], lay.n_chunks, lay.chunk, *t.shape[2:])[:, a:b]


def _ext(t: Tensor, lay: _Layout, a: int, b: int) -> Tensor:
    """(g, ext, ...) -> the extended rows chunks a .. b-1 need: (g, (b-a+before+after)*c, ...)."""
    return t[:, a * lay.chunk : (b + lay.before + lay.after) * lay.chunk]


def _bias(lay: _Layout, gr: _Group, a: int, b: int, dtype: torch.dtype) -> Tensor:
    """Additive mask (g, b-a, c, W) of chunks a .. b-1: -1e9 for later and padded keys, -1e5
    for the query's own position, minus log N_ij with the duplicate correction."""
    masked, own = _mask_values(dtype)
    n = b - a
    qp = _chunks(gr.qpos, lay, a, b).to(torch.int32)[..., None]  # (g, n, c, 1)
    kp = _win(_ext(gr.kpos_ext, lay, a, b), n, lay.chunk, lay.window)[:, :, None, :]  # (g,n,1,W)
    d = kp - qp  # (g, n, c, W)
    bias = torch.zeros(d.shape, dtype=dtype, device=d.device)
    bias.masked_fill_(d == 0, -own)
    if lay.causal:
        bias.masked_fill_(d > 0, -masked)
    if gr.kreal_ext is not None:
        kr = _win(_ext(gr.kreal_ext, lay, a, b), n, lay.chunk, lay.window)[:, :, None, :]
        bias.masked_fill_(~kr, -masked)
    if lay.locs is not None:
        # N_ij: how often key j lies in the windows of query i's copies, over all rounds.
        lq = lay.locs[_chunks(gr.rows, lay, a, b)]  # (g, n, c, n_h)
        lk = lay.locs[_win(_ext(gr.rows_ext, lay, a, b), n, lay.chunk, lay.window)]  # (g,n,W,nh)
        count = torch.zeros(d.shape, dtype=torch.int32, device=d.device)
        for o in range(-lay.before, lay.after + 1):
            seen = (lq + o) % lay.n_chunks  # (g, n, c, n_h): chunks query i sees at offset o
            hit = seen[:, :, :, None, :, None] == lk[:, :, None, :, None, :]  # (g,n,c,W,nh,nh)
            count += hit.sum((-1, -2), dtype=torch.int32)
        bias -= torch.log(count.clamp_min(1).to(dtype))
    return bias


def _keep_mask(shape, gen: torch.Generator, p: float, device, dtype) -> Tensor:
    """Dropout multiplier (0 or 1/(1-p)) of ``shape`` drawn from ``gen``."""
    keep = torch.rand(shape, generator=gen, device=device) >= p
    return keep.to(dtype) / (1.0 - p)


def _dropout_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _use_fused(q: Tensor, dropout_p: float, impl: str) -> bool:
    if impl == "manual":
        return False
    ok = flash_unavailable(q, dropout_p=dropout_p) is None
    if impl == "fused" and not ok:
        raise ValueError(
            "impl='fused' needs the CPU flash-attention kernel, a CPU tensor and no dropout"
        )
    return ok


def _block_inputs(lay, gr, a, b, q, k, v):
    """Queries (g, n, c, Dh) and window keys / values (g, n, W, Dh, strided views over the
    block's extended rows) of chunks a .. b-1, and the rows they came from."""
    g, n, dh = gr.s1 - gr.s0, b - a, q.shape[-1]
    qr = _chunks(gr.rows, lay, a, b)  # (g, n, c)
    er = _ext(gr.rows_ext, lay, a, b)  # (g, (n + E) c)
    qb = q[qr.reshape(-1)].view(g, n, lay.chunk, dh)
    ke, ve = k[er.reshape(-1)].view(g, -1, dh), v[er.reshape(-1)].view(g, -1, dh)
    kw, vw = _win(ke, n, lay.chunk, lay.window), _win(ve, n, lay.chunk, lay.window)
    return qr, er, qb, kw, vw


class _LSHCore(torch.autograd.Function):
    """Chunked attention over the sorted stream, rounds combined by logsumexp.

    forward(q, k, v, layout, dropout_p, seed, fused): q, k, v (rows, Dh) -> o (rows, Dh).
    Saves q, k, v, o, one logsumexp per slot and two numbers per position (the round softmax's
    max and sum); the backward recomputes every block of logits (see the module docstring).
    """

    @staticmethod
    def forward(ctx, q, k, v, lay: _Layout, dropout_p: float, seed: int | None, fused: bool):
        acc = _acc_dtype(q.dtype)
        dh = q.shape[-1]
        o = torch.empty_like(q)
        lse_sorted = torch.empty(lay.bh, lay.slots, dtype=acc, device=q.device)
        norm = torch.empty(lay.bh, 2, lay.length, dtype=acc, device=q.device)
        gen = _dropout_generator(seed, q.device)
        with torch.autocast(q.device.type, enabled=False):
            for s0, s1 in lay.groups():
                gr = _group(lay, s0, s1)
                o_s = torch.empty(s1 - s0, lay.slots, dh, dtype=q.dtype, device=q.device)
                lse_s = lse_sorted[s0:s1]  # (g, S)
                for a, b in lay.blocks(s1 - s0):
                    _, _, qb, kw, vw = _block_inputs(lay, gr, a, b, q, k, v)
                    bias = _bias(lay, gr, a, b, q.dtype if fused else acc)
                    if fused:
                        out, lse = flash_forward(qb, kw, vw, 0.0, False, attn_mask=bias, scale=1.0)
                    else:
                        s = torch.matmul(qb, kw.transpose(-1, -2)).to(acc) + bias  # (g,n,c,W)
                        lse = torch.logsumexp(s, dim=-1)
                        # normalised by the sum, not exp(s - lse): exact when every visible
                        # logit is near -1e5 (a token alone with itself, maybe twice)
                        p = torch.softmax(s, dim=-1)
                        if gen is not None:
                            p = p * _keep_mask(p.shape, gen, dropout_p, q.device, acc)
                        out = torch.matmul(p.to(v.dtype), vw)
                    _chunks(o_s, lay, a, b).copy_(out)
                    _chunks(lse_s, lay, a, b).copy_(lse)
                o_g, norm[s0:s1] = _combine(lay, s0, s1, o_s, lse_s)
                o.index_copy_(0, lay.stream_rows[s0:s1].reshape(-1), o_g)
        ctx.save_for_backward(q, k, v, o, lse_sorted, norm)
        ctx.lay, ctx.dropout_p, ctx.seed, ctx.fused = lay, dropout_p, seed, fused
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse_sorted, norm = ctx.saved_tensors
        lay: _Layout = ctx.lay
        fused = ctx.fused
        acc = _acc_dtype(q.dtype)
        dh = q.shape[-1]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        grad_o = grad_o.contiguous()
        gen = _dropout_generator(ctx.seed, q.device)
        with torch.autocast(q.device.type, enabled=False):
            for s0, s1 in lay.groups():
                gr = _group(lay, s0, s1)
                g = s1 - s0
                lse_s = lse_sorted[s0:s1]  # (g, S)
                w = _round_weights(norm[s0:s1], lse_s, gr.qpos)  # (g, S) round weights
                # gradients per sorted slot (no scatter-add: CPU index_add_ is erratic), unsorted
                # through the inverse permutation at the end
                dq_s, dk_s, dv_s = torch.zeros(3, g, lay.slots, dh, dtype=q.dtype, device=q.device)
                for a, b in lay.blocks(g):
                    qr, _, qb, kw, vw = _block_inputs(lay, gr, a, b, q, k, v)
                    flat = qr.reshape(-1)
                    wb = _chunks(w, lay, a, b)[..., None]  # (g, n, c, 1)
                    gb = (grad_o[flat].view(qb.shape).to(acc) * wb).to(q.dtype)  # w_r dO
                    ob = o[flat].view(qb.shape)  # the combined output at each slot
                    lse = _chunks(lse_s, lay, a, b)
                    bias = _bias(lay, gr, a, b, q.dtype if fused else acc)
                    if fused:
                        gq, gk, gv = flash_backward(
                            gb, qb, kw, vw, ob, lse, 0.0, False, attn_mask=bias, scale=1.0
                        )
                    else:
                        s = torch.matmul(qb, kw.transpose(-1, -2)).to(acc) + bias
                        p = torch.softmax(s, dim=-1)  # (g, n, c, W), as in the forward
                        dp = torch.matmul(gb, vw.transpose(-1, -2)).to(acc)
                        if gen is not None:
                            m = _keep_mask(p.shape, gen, ctx.dropout_p, q.device, acc)
                            pd, dp = p * m, dp * m
                        else:
                            pd = p
                        delta = (gb.to(acc) * ob.to(acc)).sum(-1, keepdim=True)  # (g,n,c,1)
                        ds = (p * (dp - delta)).to(q.dtype)
                        gq = torch.matmul(ds, kw)  # (g, n, c, Dh)
                        gk = torch.matmul(ds.transpose(-1, -2), qb)  # (g, n, W, Dh)
                        gv = torch.matmul(pd.to(v.dtype).transpose(-1, -2), gb)
                    _chunks(dq_s, lay, a, b).copy_(gq)
                    # window part i of chunk j belongs to chunk j + i - before (circularly)
                    for i in range(lay.width):
                        part = slice(i * lay.chunk, (i + 1) * lay.chunk)
                        _add_chunks(dk_s, lay, a + i - lay.before, gk[:, :, part])
                        _add_chunks(dv_s, lay, a + i - lay.before, gv[:, :, part])
                rows = lay.stream_rows[s0:s1].reshape(-1)
                dq[rows] = _unsort(lay, s0, s1, dq_s)
                dk[rows] = _unsort(lay, s0, s1, dk_s)
                dv[rows] = _unsort(lay, s0, s1, dv_s)
        return dq, dk, dv, None, None, None, None


def _add_chunks(t_s: Tensor, lay: _Layout, first: int, part: Tensor) -> None:
    """Add part (g, n, c, Dh) to the chunks ``first .. first + n - 1`` (mod the chunk count) of
    the slot tensor t_s (g, S, Dh), as contiguous slices."""
    n, nc = part.shape[1], lay.n_chunks
    t4 = t_s.view(t_s.shape[0], nc, lay.chunk, t_s.shape[-1])
    done = 0
    while done < n:
        start = (first + done) % nc
        m = min(n - done, nc - start)
        t4[:, start : start + m] += part[:, done : done + m]
        done += m


def _unsort(lay: _Layout, s0: int, s1: int, t_s: Tensor) -> Tensor:
    """Slot values (g, S, Dh) summed over each position's rounds -> (g * L, Dh) in stream order
    (gathers through the inverse permutation, one round at a time)."""
    g, _, dh = t_s.shape
    out = None
    for r in range(lay.n_hashes):
        part = t_s.gather(1, lay.undo[s0:s1, r, :, None].expand(g, lay.length, dh))
        out = part if out is None else out + part
    return out.reshape(-1, dh)


def _combine(lay: _Layout, s0: int, s1: int, o_s: Tensor, lse_s: Tensor) -> tuple[Tensor, Tensor]:
    """Unsort the rounds and weight them by their logsumexp: o_s (g, S, Dh), lse_s (g, S) ->
    o (g * L, Dh) in stream order and ``norm`` (g, 2, L): the max over rounds and the sum of
    ``exp(lse_r - max)``, so that a slot's round weight is ``exp(lse - max) / sum`` (a softmax
    over rounds: the weights sum to 1 to rounding even when every round's logsumexp is near
    -1e5, a token alone with itself). Gathers through the inverse permutation, one round at a
    time (no scatter)."""
    g, _, dh = o_s.shape
    undo = lay.undo[s0:s1]  # (g, n_h, L)
    lse_r = lse_s.gather(1, undo.reshape(g, -1)).view(g, lay.n_hashes, lay.length)
    top = lse_r.amax(dim=1)  # (g, L)
    e = torch.exp(lse_r - top[:, None])  # (g, n_h, L)
    z = e.sum(1)  # (g, L)
    w = (e / z[:, None]).to(
        torch.float32 if o_s.dtype in (torch.float16, torch.bfloat16) else o_s.dtype
    )
    o = None
    for r in range(lay.n_hashes):
        o_r = o_s.gather(1, undo[:, r, :, None].expand(g, lay.length, dh))  # (g, L, Dh)
        term = o_r.to(w.dtype) * w[:, r, :, None]
        o = term if o is None else o + term
    return o.reshape(-1, dh).to(o_s.dtype), torch.stack([top, z], dim=1)


def _round_weights(norm: Tensor, lse_s: Tensor, qpos: Tensor) -> Tensor:
    """Round weight of each slot (g, S) from its logsumexp lse_s (g, S), the position's
    ``norm`` (g, 2, L) and the slot positions qpos (g, S)."""
    top, z = norm[:, 0].gather(1, qpos), norm[:, 1].gather(1, qpos)
    return torch.exp(lse_s - top) / z


def _layout(
    buckets: Tensor,
    chunk: int,
    *,
    causal: bool,
    real: Tensor | None,
    n_chunks_before: int,
    n_chunks_after: int,
    duplicate_correction: bool,
) -> _Layout:
    b, h, n, t = buckets.shape
    positions, slots = sort_buckets(buckets)  # (B, H, n*L), (B, H, n, L)
    bh = b * h
    dev = buckets.device
    # flat row of (b, h, position) in the (B, L, H) order: (b * L + position) * H + h
    base = (torch.arange(b, device=dev)[:, None] * t * h + torch.arange(h, device=dev)).reshape(
        bh, 1
    )
    q_rows = positions.reshape(bh, n * t) * h + base  # (BH, S)
    stream_rows = torch.arange(t, device=dev) * h + base  # (BH, L)
    undo = slots.reshape(bh, n, t).contiguous()  # slot r * L + j of (round r, position)
    locs = None
    if duplicate_correction:
        chunk_of = (undo // chunk).transpose(1, 2).reshape(-1, n)  # (BH*L, n) in stream order
        locs = torch.empty(b * t * h, n, dtype=chunk_of.dtype, device=dev)
        locs[stream_rows.reshape(-1)] = chunk_of
    return _Layout(
        bh=bh,
        heads=h,
        length=t,
        n_hashes=n,
        chunk=chunk,
        n_chunks=n * t // chunk,
        before=n_chunks_before,
        after=n_chunks_after,
        causal=causal,
        q_rows=q_rows.contiguous(),
        undo=undo,
        stream_rows=stream_rows.contiguous(),
        real=None if real is None else real.reshape(-1).to(torch.bool),
        locs=locs,
    )


def _check_core_args(q: Tensor, buckets: Tensor, chunk: int) -> None:
    b, h, t, _ = q.shape
    if t % chunk:
        raise ValueError(f"LSH attention needs L a multiple of chunk, got L={t}, chunk={chunk}")
    if buckets.dim() != 4 or buckets.shape[:2] != (b, h) or buckets.shape[-1] != t:
        raise ValueError(
            f"buckets must be (B={b}, H={h}, n_hashes, L={t}), got {tuple(buckets.shape)}"
        )


def _rows(t: Tensor) -> Tensor:
    """(B, H, L, Dh) -> flat (B*L*H, Dh) rows in (B, L, H) order; a view when ``t`` is a
    head-transposed view of a (B, L, H, Dh) tensor (the projections' output)."""
    return t.transpose(1, 2).reshape(-1, t.shape[-1])


def lsh_attention(
    q: Tensor,
    v: Tensor,
    buckets: Tensor,
    chunk: int,
    *,
    causal: bool,
    real: Tensor | None = None,
    n_chunks_before: int = 1,
    n_chunks_after: int = 0,
    duplicate_correction: bool = False,
    dropout_p: float = 0.0,
    impl: str = "auto",
) -> Tensor:
    """LSH attention over shared-QK vectors q (B, H, L, Dh) and values v (B, H, L, Dh) with
    buckets (B, H, n_hashes, L) -> (B, H, L, Dh) (a head-transposed view of (B, L, H, Dh)).
    ``L`` must be a multiple of ``chunk``; ``real``: (B, L) bool, False = padding (give padding
    the padding bucket). ``impl``: ``"auto"`` (PyTorch's fused CPU flash kernel per block
    where it applies -- CPU, no dropout -- else plain matmuls), ``"fused"`` or ``"manual"``
    (the same arithmetic either way)."""
    if impl not in ("auto", "fused", "manual"):
        raise ValueError(f"impl must be 'auto', 'fused' or 'manual', got {impl!r}")
    _check_core_args(q, buckets, chunk)
    b, h, t, dh = q.shape
    lay = _layout(
        buckets, chunk, causal=causal, real=real, n_chunks_before=n_chunks_before,
        n_chunks_after=n_chunks_after, duplicate_correction=duplicate_correction,
    )  # fmt: skip
    k = shared_qk_keys(q)
    seed = None
    if dropout_p > 0.0:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    fused = _use_fused(q, dropout_p, impl)
    o = _LSHCore.apply(_rows(q), _rows(k), _rows(v), lay, dropout_p, seed, fused)
    return o.view(b, t, h, dh).transpose(1, 2)


@torch.no_grad()
def lsh_attention_weights(
    q: Tensor,
    buckets: Tensor,
    chunk: int,
    *,
    causal: bool,
    real: Tensor | None = None,
    n_chunks_before: int = 1,
    n_chunks_after: int = 0,
    duplicate_correction: bool = False,
) -> Tensor:
    """The (B, H, L, L) attention weights :func:`lsh_attention` applies (rounds combined, a key
    met several times summed), computed by the same blocks and masks. O(L^2): for tests and
    inspection only; the forward never builds it."""
    _check_core_args(q, buckets, chunk)
    b, h, t, dh = q.shape
    lay = _layout(
        buckets, chunk, causal=causal, real=real, n_chunks_before=n_chunks_before,
        n_chunks_after=n_chunks_after, duplicate_correction=duplicate_correction,
    )  # fmt: skip
    qf, kf = _rows(q), _rows(shared_qk_keys(q))
    dense = torch.zeros(lay.bh, t, t, dtype=q.dtype, device=q.device)
    for s0, s1 in lay.groups():
        gr = _group(lay, s0, s1)
        g = s1 - s0
        lse_s = torch.empty(g, lay.slots, dtype=q.dtype, device=q.device)
        probs = []
        for a, b_ in lay.blocks(g):
            qr, er, qb, kw, _ = _block_inputs(lay, gr, a, b_, qf, kf, kf)
            s = torch.matmul(qb, kw.transpose(-1, -2)) + _bias(lay, gr, a, b_, q.dtype)
            _chunks(lse_s, lay, a, b_).copy_(torch.logsumexp(s, -1))
            kpos = lay.position(_win(er, b_ - a, lay.chunk, lay.window))  # (g, n, W)
            probs.append((a, b_, torch.softmax(s, -1), kpos))
        dummy = torch.zeros(g, lay.slots, 1, dtype=q.dtype, device=q.device)
        _, norm = _combine(lay, s0, s1, dummy, lse_s)
        w = _round_weights(norm, lse_s, gr.qpos)  # (g, S)
        for a, b_, p, kpos in probs:
            qp = _chunks(gr.qpos, lay, a, b_)  # (g, n, c)
            pw = p * _chunks(w, lay, a, b_)[..., None]  # (g, n, c, W)
            stream = torch.arange(s0, s1, device=q.device)[:, None, None, None].expand_as(pw)
            idx = (stream, qp[..., None].expand_as(pw), kpos[:, :, None, :].expand_as(pw))
            dense.index_put_(idx, pw, accumulate=True)
    return dense.view(b, h, t, t)


def shared_qk_reference(
    q: Tensor, v: Tensor, *, causal: bool, real: Tensor | None = None
) -> Tensor:
    """Full shared-QK attention with the LSH layer's logits and masks (unit keys, no 1/sqrt(Dh),
    ``-1e9`` for later and padded keys, ``-1e5`` for the query's own position): what LSH
    attention computes when one chunk covers the sequence. q, v (B, H, L, Dh) -> (B, H, L, Dh).
    Materialises (L, L) logits: the oracle for tests."""
    t = q.shape[2]
    s = q @ shared_qk_keys(q).transpose(-1, -2)  # (B, H, L, L)
    pos = torch.arange(t, device=q.device)
    s = s - (pos[None, :] == pos[:, None]).to(s.dtype) * SELF_MASK_VALUE
    if causal:
        s = s - (pos[None, :] > pos[:, None]).to(s.dtype) * CAUSAL_MASK_VALUE
    if real is not None:
        s = s - (~real)[:, None, None, :].to(s.dtype) * CAUSAL_MASK_VALUE
    return torch.softmax(s, dim=-1) @ v


# ------------------------------------------------------------------------------------- module


class LSHAttention(AttentionPart):
    """Multi-head shared-QK LSH self-attention (see the module docstring).

    Projections: ``qk_proj`` (shared queries/keys), ``v_proj``, ``o_proj``.
    """

    def __init__(self, config: LSHConfig, dims: AttentionDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        d, inner = dims.dim, dims.inner_dim
        self.qk_proj = nn.Linear(d, inner, bias=config.bias)
        self.v_proj = nn.Linear(d, inner, bias=config.bias)
        self.o_proj = nn.Linear(inner, d, bias=config.bias)

    def prepare_key(self):
        # One plan per layer: each layer draws its own rotations.
        return (type(self), self.config, self.dims.layer)

    def bucket_factors(self, padded: int) -> tuple[int, ...]:
        nb = self.config.n_buckets
        if nb is None:
            return default_bucket_factors(padded, self.config.chunk_len)
        return (nb,) if isinstance(nb, int) else tuple(nb)

    def prepare(self, ctx: PrepareContext, shared: nn.Module | None) -> LSHPlan:
        """Chunking for this forward's length and this layer's random rotations,
        (H, Dh, n_hashes, buckets/2) float32, drawn from ``ctx.generator`` (or the global RNG)."""
        if ctx.tq != ctx.tk:
            raise ValueError(
                f"LSH attention is self-attention over one sequence (Tq = Tk), got "
                f"Tq={ctx.tq}, Tk={ctx.tk}"
            )
        t = ctx.tk
        chunk = max(1, min(self.config.chunk_len, t))
        padded = -(-t // chunk) * chunk
        factors = self.bucket_factors(padded)
        shape = (self.dims.n_heads, self.dims.head_dim, self.config.n_hashes, sum(factors) // 2)
        g = ctx.generator
        device = g.device if g is not None else ctx.device
        rotations = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        return LSHPlan(t, chunk, padded, factors, rotations.to(ctx.device))

    @classmethod
    def example_config(cls, config: LSHConfig, seq_len: int) -> LSHConfig:
        return dataclasses.replace(config, chunk_len=max(1, seq_len // 8), n_hashes=2)

    @classmethod
    def degenerate_config(cls, config: LSHConfig, seq_len: int) -> LSHConfig:
        return dataclasses.replace(config, chunk_len=seq_len, n_buckets=None)

    @classmethod
    def causal_config(cls, config: LSHConfig, seq_len: int) -> None:
        return None  # causal in its weights only (see the module docstring)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.dims.n_heads, self.dims.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def dense_reference(
        self, x: Tensor, *, kv: Tensor | None = None, mask: AttentionMask | None = None
    ) -> Tensor:
        """Full shared-QK attention (:func:`shared_qk_reference`) with this layer's projections
        and masks: the degenerate limit (one chunk covering the sequence). (B, T, D)."""
        if kv is not None:
            raise ValueError("LSH attention is self-attention; kv must be None")
        b, t, _ = x.shape
        causal = self.dims.causal if mask is None else mask.causal
        real = None if mask is None or mask.key_padding is None else mask.key_padding.bool()
        o = shared_qk_reference(
            self._heads(self.qk_proj(x)), self._heads(self.v_proj(x)), causal=causal, real=real
        )
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))

    def forward(
        self,
        x: Tensor,
        *,
        kv: Tensor | None = None,
        mask: AttentionMask | None = None,
        state: None = None,
        positions: LSHPlan | None = None,
    ) -> AttentionOutput:
        """x: (B, T, D) -> out (B, T, D). ``positions``: the :class:`LSHPlan` from prepare, or a
        previous call's ``AttentionOutput.replay`` (same plan with its buckets) to re-run on the
        same buckets."""
        check_attention_inputs(x, kv, self.dims.dim, mask)
        if kv is not None or state is not None:
            raise ValueError("LSH attention takes neither kv nor state (self-attention only)")
        if mask is not None and mask.causal != self.dims.causal:
            raise ValueError(
                f"this LSH attention was built for causal={self.dims.causal}, got a mask with "
                f"causal={mask.causal}"
            )
        b, t, _ = x.shape
        if not isinstance(positions, LSHPlan) or positions.length != t:
            raise ValueError(
                f"LSH attention needs positions=LSHPlan from its prepare() for length {t}, got "
                f"{type(positions).__name__}"
                + (f" for length {positions.length}" if isinstance(positions, LSHPlan) else "")
            )
        plan = positions
        pad = plan.padded - t
        h, dh = self.dims.n_heads, self.dims.head_dim
        qk = self.qk_proj(x).view(b, t, h, dh)  # (B, T, H, Dh)
        v = self.v_proj(x).view(b, t, h, dh)
        kp = None if mask is None else mask.key_padding
        real = None
        if kp is not None or pad:
            real = torch.ones(b, t, dtype=torch.bool, device=x.device) if kp is None else kp.bool()
            real = F.pad(real, (0, pad), value=False)  # (B, Lp)
        if pad:
            qk = F.pad(qk, (0, 0, 0, 0, 0, pad))  # (B, Lp, H, Dh)
            v = F.pad(v, (0, 0, 0, 0, 0, pad))
        qk, v = qk.transpose(1, 2), v.transpose(1, 2)  # (B, H, Lp, Dh) views: no copies
        buckets = plan.buckets
        if buckets is None:
            buckets = hash_vectors(qk, plan.rotations, plan.factors)  # (B, H, n_h, Lp)
            if real is not None:
                buckets = buckets.masked_fill(~real[:, None, None, :], plan.n_buckets)
            buckets = buckets.to(torch.int32)
        elif buckets.shape != (b, self.dims.n_heads, self.config.n_hashes, plan.padded):
            raise ValueError(
                f"replayed buckets must be (B={b}, H={self.dims.n_heads}, n_hashes="
                f"{self.config.n_hashes}, {plan.padded}), got {tuple(buckets.shape)}"
            )
        p = self.dims.dropout if self.training else 0.0
        o = lsh_attention(
            qk,
            v,
            buckets,
            plan.chunk,
            causal=self.dims.causal,
            real=real,
            n_chunks_before=self.config.n_chunks_before,
            n_chunks_after=self.config.n_chunks_after,
            duplicate_correction=self.config.duplicate_correction,
            dropout_p=p,
        )  # (B, H, Lp, Dh)
        o = o[:, :, :t].transpose(1, 2).reshape(b, t, -1)  # (B, T, H*Dh)
        return AttentionOutput(
            out=self.o_proj(o), replay=dataclasses.replace(plan, buckets=buckets)
        )


def with_n_hashes(config: AttentionConfig, n_hashes: int) -> AttentionConfig:
    """``config`` with every LSH part's ``n_hashes`` set (inside layer patterns too); other
    mechanisms unchanged. ``n_hashes`` changes no weights, so a trained model rebuilt with it
    loads the same state dict."""
    if isinstance(config, LSHConfig):
        return dataclasses.replace(config, n_hashes=n_hashes)
    layers = getattr(config, "layers", None)
    if isinstance(layers, tuple) and all(isinstance(c, AttentionConfig) for c in layers):
        return dataclasses.replace(config, layers=tuple(with_n_hashes(c, n_hashes) for c in layers))
    return config


register_attention(
    "lsh",
    LSHConfig,
    LSHAttention,
    description="angular-LSH shared-QK attention over sorted chunks (Reformer, Kitaev et al. 2020)",
)
