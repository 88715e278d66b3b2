"""effiformer's LSH attention against HF transformers' ``LSHSelfAttention`` with the same weights
and the same random rotations, in float64: the buckets (with HF's per-round offsets and its extra
padding bucket) and the attention output before the output projection agree on full tensors,
causal and bidirectional, 1-4 hashes, one and two bucket factors, with and without padding, and
with chunks looking both back and ahead. A circular look-back is what both do (chunk 0 of round 0
sees the last chunk of the last round): a non-circular mutant changes the first chunk's output."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.reference

transformers = pytest.importorskip("transformers", reason="needs the 'reference' extra")
from transformers.models.reformer.modeling_reformer import LSHSelfAttention  # noqa: E402

from effiformer.attention import AttentionDims, AttentionMask  # noqa: E402
from effiformer.attention.lsh import (  # noqa: E402
    LSHAttention,
    LSHConfig,
    LSHPlan,
    hash_vectors,
)

D, HEADS, DH, CHUNK, SEED = 24, 3, 8, 8, 7


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _pair(causal, n_hashes, n_buckets, before=1, after=0):
    """(HF layer, ours) in float64 with HF's projections copied and an identity output
    projection (HF's LSHSelfAttention ends before ReformerSelfOutput's dense layer)."""
    config = transformers.ReformerConfig(
        hidden_size=D, num_attention_heads=HEADS, attention_head_size=DH,
        lsh_attn_chunk_length=CHUNK, num_hashes=n_hashes,
        num_buckets=n_buckets if isinstance(n_buckets, int) else list(n_buckets),
        lsh_num_chunks_before=before, lsh_num_chunks_after=after, hash_seed=SEED,
        is_decoder=causal, lsh_attention_probs_dropout_prob=0.0, attn_layers=["lsh"],
    )  # fmt: skip
    torch.manual_seed(0)
    hf = LSHSelfAttention(config).double().eval()
    factors = (n_buckets,) if isinstance(n_buckets, int) else tuple(n_buckets)
    ours_cfg = LSHConfig(
        chunk_len=CHUNK, n_hashes=n_hashes, n_buckets=n_buckets, n_chunks_before=before,
        n_chunks_after=after,
    )  # fmt: skip
    dims = AttentionDims(D, HEADS, DH, causal=causal, layer=0, n_layers=1)
    ours = LSHAttention.from_config(ours_cfg, dims).double().eval()
    with torch.no_grad():
        ours.qk_proj.weight.copy_(hf.query_key.weight)
        ours.v_proj.weight.copy_(hf.value.weight)
        ours.o_proj.weight.copy_(torch.eye(D, dtype=torch.float64))
    return hf, ours, factors


def _hf_rotations(n_hashes, factors):
    """The rotations HF's ``_hash_vectors`` draws: torch.randn after manual_seed(hash_seed),
    (H, Dh, n_hashes, sum(factors) / 2) in the vectors' dtype; ours take the same layout."""
    torch.manual_seed(SEED)
    return torch.randn(HEADS, DH, n_hashes, sum(factors) // 2, dtype=torch.float64)


def _inputs(t, padded):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, t, D, generator=g, dtype=torch.float64)
    mask = None
    if padded:
        mask = torch.ones(2, t, dtype=torch.long)
        mask[0, t - 5 :] = 0  # the end of the first row is padding
        mask[1, t - 11 :] = 0
    return x, mask


CASES = [
    # (causal, n_hashes, n_buckets, before, after, padded)
    (True, 1, 8, 1, 0, False),
    (True, 2, 8, 1, 0, False),
    (True, 4, 8, 1, 0, True),
    (False, 1, 8, 1, 0, False),
    (False, 3, 8, 1, 0, True),
    (False, 2, (4, 4), 1, 0, False),
    (True, 2, (4, 2), 1, 0, True),
    (False, 2, 8, 1, 1, False),
]


@pytest.mark.parametrize("causal, n_hashes, n_buckets, before, after, padded", CASES)
def test_equals_hf_lsh_self_attention(causal, n_hashes, n_buckets, before, after, padded):
    t = 4 * CHUNK
    hf, ours, factors = _pair(causal, n_hashes, n_buckets, before, after)
    x, mask = _inputs(t, padded)
    with torch.no_grad():
        want = hf(x, attention_mask=mask).hidden_states  # (B, T, H * Dh)
        # HF's buckets: per round, with offsets r * (buckets + 1 if padding else buckets)
        qk = ours._heads(ours.qk_proj(x))  # (B, H, T, Dh)
        hf_buckets = hf._hash_vectors(qk, n_hashes, mask)  # (B, H, n_hashes * T)
        rot = _hf_rotations(n_hashes, factors)
        mine = hash_vectors(qk, rot, factors)  # (B, H, n_hashes, T)
        n_b = math.prod(factors)
        if mask is not None:
            mine = mine.masked_fill(~mask.bool()[:, None, None, :], n_b)
            n_b += 1
        offsets = (torch.arange(n_hashes) * n_b)[:, None]
        assert torch.equal((mine + offsets).flatten(2), hf_buckets)
        assert len(torch.unique(hf_buckets)) > n_hashes  # the inputs really spread over buckets
        plan = LSHPlan(t, CHUNK, t, factors, rot)
        amask = AttentionMask(causal=causal, key_padding=None if mask is None else mask.bool())
        got = ours(x, mask=amask, positions=plan).out
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_the_look_back_is_circular_in_both():
    """HF's (and trax's) chunk 0 of the sorted stream looks back at the stream's last chunk;
    the output of the first chunk's queries differs from a look-back that stops at the start, so
    the agreement above pins the circular form (bidirectional: every key of that chunk counts)."""
    t = 4 * CHUNK
    hf, ours, factors = _pair(False, 2, 8)
    x, _ = _inputs(t, False)
    with torch.no_grad():
        want = hf(x).hidden_states
        # the same layer with the look-back cut at the stream's start: no previous chunk at all
        hf_none, ours_none, _ = _pair(False, 2, 8, before=0)
        ours_none.load_state_dict(ours.state_dict())
        rot = _hf_rotations(2, factors)
        plan = LSHPlan(t, CHUNK, t, factors, rot)
        circ = ours(x, mask=AttentionMask(causal=False), positions=plan).out
        cut = ours_none(x, mask=AttentionMask(causal=False), positions=plan).out
    assert_close(circ, want, rtol=1e-10, atol=1e-10)
    assert (circ - cut).abs().max() > 1e-3
