"""Reformer LSH attention: the degenerate limit equals full shared-QK attention, more hashes
approach it, the sort is a permutation ordered by (bucket, position), masks give later and
padded keys exactly zero weight, the custom backward passes gradcheck (both kernels, dropout
replayed), and the layer really hashes at lengths longer than one chunk."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model
from effiformer.attention import AttentionDims, AttentionMask, PrepareContext
from effiformer.attention.local import LocalConfig
from effiformer.attention.lsh import (
    LSHAttention,
    LSHConfig,
    LSHPlan,
    default_bucket_factors,
    hash_vectors,
    lsh_attention,
    lsh_attention_weights,
    shared_qk_keys,
    shared_qk_reference,
    sort_buckets,
    with_n_hashes,
)
from effiformer.attention.pattern import PatternConfig
from effiformer.config import ConfigError, parse_overrides

B, H, DH = 2, 2, 8


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _qv(t, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, DH, generator=g, dtype=dtype) * scale
    v = torch.randn(B, H, t, DH, generator=g, dtype=dtype)
    return q, v


def _buckets(q, n_hashes, factors, seed=0, real=None):
    g = torch.Generator().manual_seed(seed + 100)
    rot = torch.randn(H, DH, n_hashes, sum(factors) // 2, generator=g)
    bk = hash_vectors(q, rot, factors)
    if real is not None:
        import math

        bk = bk.masked_fill(~real[:, None, None, :], math.prod(factors))
    return bk


def _layer(config, causal=True, dim=16, heads=2, layer=0):
    torch.manual_seed(0)
    dims = AttentionDims(dim, heads, dim // heads, causal=causal, layer=layer, n_layers=4)
    return LSHAttention.from_config(config, dims).double().eval()


def _run(m, x, mask, seed=0, plan=None):
    ctx = PrepareContext(
        tq=x.shape[1], tk=x.shape[1], mask=mask, device=x.device, dtype=x.dtype,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    return m(x, mask=mask, positions=plan if plan is not None else m.prepare(ctx, None))


# ---------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("n_hashes", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_one_chunk_equals_full_shared_qk_attention(n_hashes, causal):
    t = 40
    q, v = _qv(t)
    real = torch.ones(B, t, dtype=torch.bool)
    real[1, -7:] = False
    for kp in (None, real):
        bk = _buckets(q, n_hashes, (2,), real=kp)
        out = lsh_attention(q, v, bk, t, causal=causal, real=kp)
        want = shared_qk_reference(q, v, causal=causal, real=kp)
        rows = torch.ones(B, t, dtype=torch.bool) if kp is None else kp
        assert_close(out.transpose(1, 2)[rows], want.transpose(1, 2)[rows], rtol=1e-9, atol=1e-9)


def test_one_chunk_module_equals_dense_reference_at_a_length_that_is_not_a_power_of_two():
    t = 37
    cfg = LSHAttention.degenerate_config(LSHConfig(n_hashes=3), t)
    m = _layer(cfg)
    x = torch.randn(B, t, 16, dtype=torch.float64)
    mask = AttentionMask(causal=True)
    assert_close(_run(m, x, mask).out, m.dense_reference(x, mask=mask), rtol=1e-9, atol=1e-9)


def test_keys_are_unit_length_and_logits_are_unscaled():
    q = torch.randn(3, 5, 64, dtype=torch.float64) * 4
    k = shared_qk_keys(q)
    assert_close(k.norm(dim=-1), torch.ones(3, 5, dtype=torch.float64), rtol=1e-6, atol=0)
    # One chunk, one key besides the query's own: the logit is q . k_hat (no 1/sqrt(Dh)).
    qq = torch.randn(1, 1, 2, 4, dtype=torch.float64) * 3
    w = lsh_attention_weights(qq, torch.zeros(1, 1, 1, 2, dtype=torch.long), 2, causal=False)
    kh = shared_qk_keys(qq)[0, 0]
    logit = qq[0, 0, 0] @ kh[1]  # query 0 sees key 1 (its own key gets -1e5)
    assert_close(w[0, 0, 0, 1], torch.tensor(1.0, dtype=torch.float64))  # only one other key
    w2 = lsh_attention_weights(
        torch.cat([qq, qq[:, :, :1]], 2)[:, :, [0, 1, 1, 0]],
        torch.zeros(1, 1, 1, 4, dtype=torch.long),
        4,
        causal=False,
    )  # query 0 sees keys 1, 2 (same vector) and 3 (a copy of itself at another position)
    e = torch.exp(torch.stack([logit, logit, qq[0, 0, 0] @ kh[0]]))
    assert_close(w2[0, 0, 0, 1:], e / e.sum(), rtol=1e-9, atol=1e-12)


def test_error_against_full_attention_falls_as_hashes_grow():
    t, chunk = 128, 16
    errs = {n: [] for n in (1, 2, 4, 8)}
    for seed in range(3):
        q, v = _qv(t, seed, scale=6.0)  # sharpened: a few keys dominate every row
        want = shared_qk_reference(q, v, causal=False)
        for n in errs:
            bk = _buckets(q, n, default_bucket_factors(t, chunk), seed)
            out = lsh_attention(q, v, bk, chunk, causal=False, duplicate_correction=True)
            errs[n].append((out - want).abs().mean().item())
    mean = {n: sum(e) / len(e) for n, e in errs.items()}
    assert mean[1] > mean[2] > mean[4] > mean[8], mean
    assert mean[8] < 0.25 * mean[1], mean


def test_duplicate_correction_counts_keys_met_in_several_rounds_once():
    # One chunk per round and look-back: every key sits twice in every window (own round and
    # the previous one). Uncorrected, equal duplication cancels; corrected, too. With a
    # different number of copies per key only the correction gives full attention.
    t = 16
    q, v = _qv(t)
    for n in (1, 3):
        bk = _buckets(q, n, (2,))
        want = shared_qk_reference(q, v, causal=True)
        got = lsh_attention(q, v, bk, t, causal=True, duplicate_correction=True)
        assert_close(got, want, rtol=1e-9, atol=1e-9)
    # chunk = L/2, two rounds: counts differ per pair; rows of the weights still sum to 1
    bk = _buckets(q, 2, (4,))
    w = lsh_attention_weights(q, bk, t // 2, causal=True, duplicate_correction=True)
    assert_close(w.sum(-1), torch.ones(B, H, t, dtype=torch.float64), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------- sort, masks


def test_sort_is_a_permutation_ordered_by_bucket_then_position():
    g = torch.Generator().manual_seed(0)
    t, n = 50, 3
    bk = torch.randint(0, 7, (B, H, n, t), generator=g)
    positions, slots = sort_buckets(bk)
    pos = positions.view(B, H, n, t)
    sorted_b = bk.gather(-1, pos)
    assert (sorted_b[..., 1:] >= sorted_b[..., :-1]).all()  # buckets non-decreasing
    same = sorted_b[..., 1:] == sorted_b[..., :-1]
    assert (pos[..., 1:] > pos[..., :-1])[same].all()  # positions increase inside a bucket
    ar = torch.arange(t).expand(B, H, n, t)
    # unsort(sort(x)) = x and sort(unsort(x)) = x
    local = slots - (torch.arange(n) * t)[:, None]
    assert torch.equal(pos.gather(-1, local), ar)
    assert torch.equal(local.gather(-1, pos), ar)
    assert torch.equal(positions.view(B, H, n * t).gather(-1, slots.view(B, H, n * t)),
                       ar.reshape(B, H, n * t))  # fmt: skip


@pytest.mark.parametrize("dup", [False, True])
def test_later_positions_get_exactly_zero_weight_and_the_first_token_sees_itself(dup):
    t, chunk = 64, 8
    q, v = _qv(t)
    bk = _buckets(q, 2, default_bucket_factors(t, chunk))
    w = lsh_attention_weights(q, bk, chunk, causal=True, duplicate_correction=dup)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    assert (w[..., future] == 0).all()
    assert_close(w[..., 0, 0], torch.ones(B, H, dtype=torch.float64), rtol=0, atol=1e-12)
    assert_close(w.sum(-1), torch.ones(B, H, t, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    out = lsh_attention(q.requires_grad_(), v, bk, chunk, causal=True, duplicate_correction=dup)
    assert torch.isfinite(out).all()
    assert_close(out[..., 0, :], v[..., 0, :], rtol=1e-9, atol=1e-9)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # the weights are what the forward applies
    assert_close(out, w @ v, rtol=1e-9, atol=1e-9)


def test_padded_keys_get_zero_weight():
    t, chunk = 48, 8
    q, v = _qv(t)
    real = torch.ones(B, t, dtype=torch.bool)
    real[0, -11:] = False
    for causal in (True, False):
        bk = _buckets(q, 2, default_bucket_factors(t, chunk), real=real)
        w = lsh_attention_weights(q, bk, chunk, causal=causal, real=real)
        assert (w[0, :, :, -11:][:, real[0]] == 0).all()
        assert_close(w.sum(-1), torch.ones(B, H, t, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_lsh_is_exercised_beyond_one_chunk():
    # Each query sees at most n_hashes windows of (1 + before) chunks, not every key.
    t, chunk, n = 128, 8, 2
    q, v = _qv(t)
    bk = _buckets(q, n, default_bucket_factors(t, chunk))
    w = lsh_attention_weights(q, bk, chunk, causal=False)
    assert ((w > 0).sum(-1) <= n * 2 * chunk).all()
    assert (w == 0).float().mean() > 0.7
    out = lsh_attention(q, v, bk, chunk, causal=False)
    assert not torch.allclose(out, shared_qk_reference(q, v, causal=False), atol=1e-3)
    # a key that shares no window with query 0 does not reach it
    far = int((w[0, 0, 0] == 0).nonzero()[0])
    v2 = v.clone()
    v2[0, 0, far] += 10.0
    out2 = lsh_attention(q, v2, bk, chunk, causal=False)
    assert torch.equal(out2[0, 0, 0], out[0, 0, 0])


# ---------------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("impl", ["fused", "manual"])
def test_custom_backward_passes_gradcheck(impl):
    t, chunk = 24, 4
    q, v = _qv(t)
    q, v = q[:1, :1].clone().requires_grad_(), v[:1, :1].clone().requires_grad_()
    real = torch.ones(1, t, dtype=torch.bool)
    real[0, -3:] = False
    for causal, after, dup in ((True, 0, False), (False, 1, True)):
        kp = real if not causal else None
        g = torch.Generator().manual_seed(5)
        rot = torch.randn(1, DH, 2, 3, generator=g)
        bk = hash_vectors(q.detach(), rot, (6,))
        if kp is not None:
            bk = bk.masked_fill(~kp[:, None, None, :], 6)

        def f(q_, v_, bk=bk, causal=causal, kp=kp, after=after, dup=dup):
            return lsh_attention(
                q_, v_, bk, chunk, causal=causal, real=kp, n_chunks_after=after,
                duplicate_correction=dup, impl=impl,
            )  # fmt: skip

        assert torch.autograd.gradcheck(f, (q, v))


def test_dropout_is_replayed_in_the_backward():
    t, chunk = 16, 4
    q, v = _qv(t)
    q, v = q[:1, :1].clone().requires_grad_(), v[:1, :1].clone().requires_grad_()
    bk = _buckets(q.detach().expand(B, H, t, DH), 2, (4,))[:1, :1]

    def f(q_, v_):
        torch.manual_seed(3)  # the dropout seed is drawn from the global RNG at the call
        return lsh_attention(q_, v_, bk, chunk, causal=True, dropout_p=0.3)

    assert torch.autograd.gradcheck(f, (q, v))
    torch.manual_seed(3)
    a = lsh_attention(q, v, bk, chunk, causal=True, dropout_p=0.3)
    b = lsh_attention(q, v, bk, chunk, causal=True)
    assert not torch.allclose(a, b)


def test_fused_and_manual_kernels_agree():
    t, chunk = 64, 8
    q, v = _qv(t)
    real = torch.ones(B, t, dtype=torch.bool)
    real[1, -9:] = False
    bk = _buckets(q, 3, default_bucket_factors(t, chunk), real=real)
    res = []
    for impl in ("fused", "manual"):
        q_, v_ = q.clone().requires_grad_(), v.clone().requires_grad_()
        o = lsh_attention(q_, v_, bk, chunk, causal=True, real=real, impl=impl)
        (o * torch.arange(t, dtype=o.dtype)[:, None]).sum().backward()
        res.append((o, q_.grad, v_.grad))
    for a, b in zip(*res):
        assert_close(a, b, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------- the module


def test_rotations_come_from_the_generator_per_layer_and_are_resampled():
    cfg = LSHConfig(chunk_len=8, n_hashes=2)
    m0, m1 = _layer(cfg, layer=0), _layer(cfg, layer=1)
    assert m0.prepare_key() != m1.prepare_key()

    def plan(m, seed):
        ctx = PrepareContext(
            tq=64, tk=64, mask=AttentionMask(causal=True), device=torch.device("cpu"),
            dtype=torch.float64, generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        return m.prepare(ctx, None)

    a, b = plan(m0, 0), plan(m0, 0)
    assert torch.equal(a.rotations, b.rotations)  # same generator state: same rotations
    assert not torch.equal(a.rotations, plan(m0, 1).rotations)  # a new draw per forward
    assert a.rotations.shape == (2, 8, 2, 16 // 2)  # (H, Dh, n_hashes, buckets / 2)
    assert a.factors == (16,) and a.chunk == 8


def test_replay_reuses_the_buckets_on_perturbed_inputs():
    cfg = LSHConfig(chunk_len=8, n_hashes=2)
    m = _layer(cfg)
    x = torch.randn(B, 64, 16, dtype=torch.float64)
    mask = AttentionMask(causal=True)
    first = _run(m, x, mask)
    assert isinstance(first.replay, LSHPlan) and first.replay.buckets is not None
    again = _run(m, x, mask, plan=first.replay)
    assert torch.equal(again.out, first.out)
    x2 = x + 0.3 * torch.randn_like(x)  # enough to move hashes
    fresh = _run(m, x2, mask)
    assert not torch.equal(fresh.replay.buckets, first.replay.buckets)
    replayed = _run(m, x2, mask, plan=first.replay)
    assert torch.equal(replayed.replay.buckets, first.replay.buckets)
    assert not torch.allclose(replayed.out, fresh.out)


def test_lengths_not_a_multiple_of_the_chunk_are_padded_with_their_own_bucket():
    m = _layer(LSHConfig(chunk_len=8, n_hashes=2))
    x = torch.randn(B, 29, 16, dtype=torch.float64)
    out = _run(m, x, AttentionMask(causal=True))
    assert out.out.shape == (B, 29, 16) and torch.isfinite(out.out).all()
    assert out.replay.buckets.shape == (B, 2, 2, 32)
    assert (out.replay.buckets[..., 29:] == out.replay.n_buckets).all()
    # the earlier tokens do not see the padding: the same as a length-32 input whose three
    # extra tokens are padding
    x32 = torch.cat([x, torch.randn(B, 3, 16, dtype=torch.float64)], 1)
    real = torch.ones(B, 32, dtype=torch.bool)
    real[:, 29:] = False
    out32 = _run(m, x32, AttentionMask(causal=True, key_padding=real))
    assert_close(out32.out[:, :29], out.out, rtol=1e-12, atol=1e-12)


def test_default_bucket_count_follows_trax():
    assert default_bucket_factors(1024, 128) == (16,)
    assert default_bucket_factors(64, 128) == (2,)
    assert default_bucket_factors(65536, 256) == (32, 16)  # 512 buckets, factorised
    assert default_bucket_factors(16384, 64) == (32, 16)
    m = _layer(LSHConfig(chunk_len=4, n_hashes=1, n_buckets=(4, 6)))
    ctx = PrepareContext(
        tq=32, tk=32, mask=AttentionMask(causal=True), device=torch.device("cpu"),
        dtype=torch.float64,
    )  # fmt: skip
    plan = m.prepare(ctx, None)
    assert plan.n_buckets == 24 and plan.rotations.shape[-1] == 5
    out = m(torch.randn(1, 32, 16, dtype=torch.float64), mask=ctx.mask, positions=plan)
    assert int(out.replay.buckets.max()) < 24


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="n_buckets"):
        LSHConfig(n_buckets=7)
    with pytest.raises(ConfigError, match="n_buckets"):
        LSHConfig(n_buckets=(4, 3))
    with pytest.raises(ConfigError, match="chunk_len"):
        LSHConfig(chunk_len=0)
    with pytest.raises(ConfigError, match="n_chunks_before"):
        LSHConfig(n_chunks_before=-1)
    assert LSHConfig(n_buckets=[4, 8]).n_buckets == (4, 8)


def test_forward_rejects_a_plan_for_another_length():
    m = _layer(LSHConfig(chunk_len=8))
    x = torch.randn(1, 16, 16, dtype=torch.float64)
    plan = _run(m, torch.randn(1, 24, 16, dtype=torch.float64), AttentionMask(causal=True)).replay
    with pytest.raises(ValueError, match="length 16"):
        m(x, mask=AttentionMask(causal=True), positions=plan)


def test_lsh_drops_into_the_vanilla_family_and_n_hashes_changes_no_weights():
    model = create_model(
        "vanilla-tiny", seq_len=64, attention={"name": "lsh", "chunk_len": 8, "n_hashes": 1}
    )
    assert isinstance(model.blocks[0].attn, LSHAttention)
    ids = torch.randint(0, 256, (2, 64))
    out = model(ids[:, :-1], targets=ids[:, 1:])
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    more = create_model(
        "vanilla-tiny", seq_len=64, attention=with_n_hashes(model.config.attention, 4)
    )
    more.load_state_dict(model.state_dict(), strict=True)
    assert more.blocks[1].attn.config.n_hashes == 4


def test_pattern_config_builds_the_enwik8_layers_and_round_trips():
    local, lsh = LocalConfig(window=8, bias=False), LSHConfig(chunk_len=8, n_hashes=2)
    pat = PatternConfig(layers=(local, local, lsh, local))
    model = create_model("vanilla-tiny", n_layers=8, seq_len=64, attention=pat)
    kinds = [type(b.attn).__name__ for b in model.blocks]
    assert kinds == ["LocalAttention", "LocalAttention", "LSHAttention", "LocalAttention"] * 2
    from effiformer.config import attention_config

    assert attention_config(pat.to_dict()) == pat
    over = parse_overrides(
        model.config, ["attention.name=pattern", "attention.layers=local,local,lsh,local"]
    )
    assert [c.name for c in over["attention"].layers] == ["local", "local", "lsh", "local"]
    assert with_n_hashes(pat, 8).layers[2].n_hashes == 8
    assert with_n_hashes(pat, 8).layers[0] == local
    with pytest.raises(ConfigError, match="layers"):
        PatternConfig(layers=())
    with pytest.raises(ConfigError, match=r"layers\[1\]"):
        PatternConfig(layers=("local", "nope"))


def test_example_config_exercises_chunks_at_the_contract_length():
    cfg = LSHAttention.example_config(LSHConfig(), 64)
    assert cfg.chunk_len < 64 and cfg.n_hashes > 1
    assert dataclasses.replace(cfg, chunk_len=64) == LSHAttention.degenerate_config(cfg, 64)
