"""Routing attention (Roy et al. 2020): the one-cluster limit is full causal attention on shared,
normalised queries and keys; balanced routing takes exactly w sorted tokens per centroid; the
scatter averages multiply-chosen tokens and zeroes unchosen ones (hand computation); no weight on
later positions (shared and unshared QK); online k-means (hand arithmetic, convergence on
unit-norm blobs, frozen in eval, outside the optimiser, exact under update averaging); the
commitment loss reaches only q and k; skip_first; recomputation; 2-process DDP."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from effiformer import ConfigError, create_model, get_config
from effiformer.attention import AttentionDims, AttentionMask, PrepareContext
from effiformer.attention.routing import (
    RoutingAttention,
    RoutingConfig,
    centroids_from,
    ema_update,
    kmeans_statistics,
    normalize_qk,
    route,
    routed_attention,
)
from effiformer.config import parse_overrides
from effiformer.models.transformer import VanillaConfig


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _part(config: RoutingConfig, *, dim=16, heads=2, causal=True, max_len=64, seed=0):
    torch.manual_seed(seed)
    dims = AttentionDims(dim, heads, dim // heads, causal=causal, max_len=max_len)
    return RoutingAttention.from_config(config, dims)


def _run(m, x, mask):
    ctx = PrepareContext(
        tq=x.shape[1], tk=x.shape[1], mask=mask, device=x.device, dtype=x.dtype, training=m.training
    )
    return m(x, mask=mask, positions=m.prepare(ctx, None))


# ------------------------------------------------------------------------- attention limits


@pytest.mark.parametrize("qk_norm,scale", [("layernorm", None), ("l2", 3.0)])
def test_one_cluster_with_w_equal_n_is_full_causal_attention_under_shared_qk(qk_norm, scale):
    t, dim, heads = 24, 16, 2
    cfg = RoutingConfig(routing_heads=heads, clusters=1, qk_norm=qk_norm, scale=scale)
    m = _part(cfg, dim=dim, heads=heads).double().eval()
    assert m.share_qk and m.k_proj is None and m.n_local == 0
    x = torch.randn(2, t, dim, dtype=torch.float64)
    out = _run(m, x, AttentionMask(causal=True)).out
    dh = dim // heads
    q = m.q_proj(x).view(2, t, heads, dh).transpose(1, 2)
    qn = F.layer_norm(q, (dh,), eps=1e-6) if qk_norm == "layernorm" else F.normalize(q, dim=-1)
    v = m.v_proj(x).view(2, t, heads, dh).transpose(1, 2)
    s = (1.0 if scale is None else scale) * qn @ qn.transpose(-1, -2)  # (B, H, T, T)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    want = m.o_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, t, dim))
    assert_close(out, want, rtol=1e-10, atol=1e-10)


def test_every_cluster_takes_exactly_w_sorted_tokens_by_score():
    g = torch.Generator().manual_seed(0)
    b, h, k, t, w = 2, 3, 5, 40, 7
    scores = torch.randn(b, h, k, t, generator=g)
    idx = route(scores, w)
    assert idx.shape == (b, h, k, w) and idx.dtype == torch.int64
    assert bool((idx[..., 1:] > idx[..., :-1]).all())  # sorted, distinct
    for bi in range(b):
        for hi in range(h):
            for c in range(k):
                best = set(scores[bi, hi, c].argsort(descending=True)[:w].tolist())
                assert set(idx[bi, hi, c].tolist()) == best
    real = torch.ones(b, t, dtype=torch.bool)
    real[0, 30:] = False  # 30 real tokens >= w: padding is never chosen
    real[1, 4:] = False  # 4 real tokens < w: all of them are chosen
    idx = route(scores, w, real)
    assert bool((idx[0] < 30).all())
    for hi in range(h):
        for c in range(k):
            assert {0, 1, 2, 3} <= set(idx[1, hi, c].tolist())


def test_scatter_averages_multiply_chosen_tokens_and_zeroes_unchosen_ones():
    # T=5, two clusters of w=3: cluster 0 = {0, 2, 3}, cluster 1 = {2, 3, 4}; token 1 unchosen,
    # tokens 2 and 3 chosen twice.
    g = torch.Generator().manual_seed(1)
    q = F.normalize(torch.randn(1, 1, 5, 3, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 1, 5, 3, generator=g, dtype=torch.float64)
    idx = torch.tensor([[[[0, 2, 3], [2, 3, 4]]]])
    scale = 2.0
    out = routed_attention(q, q, v, idx, idx, causal=True, scale=scale)[0, 0]

    def attend(i, keys):  # by hand: softmax over the cluster's keys at positions <= i
        keys = [j for j in keys if j <= i]
        logits = [scale * float(q[0, 0, i] @ q[0, 0, j]) for j in keys]
        z = sum(math.exp(a) for a in logits)
        return sum(math.exp(a) / z * v[0, 0, j] for a, j in zip(logits, keys, strict=True))

    c0, c1 = [0, 2, 3], [2, 3, 4]
    want = torch.stack(
        [
            attend(0, c0),
            torch.zeros(3, dtype=torch.float64),
            (attend(2, c0) + attend(2, c1)) / 2,
            (attend(3, c0) + attend(3, c1)) / 2,
            attend(4, c1),
        ]
    )
    assert_close(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shared", [True, False])
def test_weights_on_later_positions_are_exactly_zero(shared):
    # With v = I (Dh = T) each output row is the (cluster-averaged) attention weight row.
    g = torch.Generator().manual_seed(2)
    b, h, t, k, w = 2, 2, 16, 3, 6
    q = normalize_qk(torch.randn(b, h, t, t, generator=g), "layernorm")
    kk = q if shared else normalize_qk(torch.randn(b, h, t, t, generator=g), "layernorm")
    mu = normalize_qk(torch.randn(h, k, t, generator=g), "layernorm")
    q_idx = route(torch.einsum("bhtd,hkd->bhkt", q, mu), w)
    k_idx = q_idx if shared else route(torch.einsum("bhtd,hkd->bhkt", kk, mu), w)
    eye = torch.eye(t).expand(b, h, t, t)
    weights = routed_attention(q, kk, eye, q_idx, k_idx, causal=True, scale=1.0)  # (B, H, T, T)
    later = torch.ones(t, t, dtype=torch.bool).triu(1)
    assert bool((weights[..., later] == 0).all())
    assert bool((weights[..., ~later] > 0).any())  # not vacuous
    rows = weights.sum(-1)
    chosen = rows > 0
    assert_close(rows[chosen], torch.ones_like(rows[chosen]))  # each row is a distribution
    # The same through the module: a later token's value never reaches an earlier output.
    cfg = RoutingConfig(routing_heads=2, clusters=3, cluster_window=6, share_qk=shared)
    m = _part(cfg, dim=16, heads=2).double().eval()
    x = torch.randn(2, t, 16, dtype=torch.float64)
    base = _run(m, x, AttentionMask(causal=True)).out
    xv = x.clone().requires_grad_()
    out = _run(m, xv, AttentionMask(causal=True)).out
    (grad,) = torch.autograd.grad(out[:, 7].sum(), xv)
    assert bool((grad[:, 8:] == 0).all()) and bool((grad[:, :8] != 0).any())
    assert_close(out, base, rtol=0, atol=0)


def test_routing_heads_reach_beyond_the_local_window_through_their_cluster():
    # q reads x[:4], v reads x[4:]: changing x[3, 4:] changes only v at position 3, so the
    # output at position 50 (local reach 40..50) changes iff routing carries it there.
    dim, dh = 8, 4
    torch.manual_seed(0)
    cfg = RoutingConfig(routing_heads=1, window=8, clusters=4, cluster_window=8)
    m = _part(cfg, dim=dim, heads=2).double().eval()
    with torch.no_grad():
        for p in (m.q_proj, m.k_proj, m.v_proj):
            p.weight.zero_()
        m.q_proj.weight[:dh, :dh] = torch.eye(dh)
        m.v_proj.weight[:dh, dh:] = torch.eye(dh)
        m.v_proj.weight[dh:, dh:] = torch.eye(dh)
        mu0 = m.centroids()[0, 0]
    x = torch.randn(1, 64, dim, dtype=torch.float64) * 0.1
    x[0, 3, :dh] = x[0, 50, :dh] = 5 * mu0 / mu0.norm()  # both top of centroid 0
    x2 = x.clone()
    x2[0, 3, dh:] += 1.0
    mask = AttentionMask(causal=True)
    a, b = _run(m, x, mask).out, _run(m, x2, mask).out
    assert not torch.allclose(a[0, 50], b[0, 50])
    local_only = _part(dataclasses.replace(cfg, routing_heads=0), dim=dim, heads=2).double().eval()
    a, b = _run(local_only, x, mask).out, _run(local_only, x2, mask).out
    assert_close(a[0, 16:], b[0, 16:], rtol=0, atol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_mute_routed_zeroes_exactly_the_routed_heads_output(causal):
    # the ablation of issue 22 (does routing's routed head help, fail to help or harm?): the
    # output is the output projection of [zeros for the routed head, the local head's output],
    # the same module's unmuted output differs, and the routed head's weights no longer matter
    cfg = RoutingConfig(window=8, clusters=4)
    m = _part(cfg, dim=16, heads=2, causal=causal).double().eval()
    muted = _part(dataclasses.replace(cfg, mute_routed=True), dim=16, heads=2, causal=causal)
    muted = muted.double().eval()
    muted.load_state_dict(m.state_dict())
    x = torch.randn(2, 32, 16, dtype=torch.float64)
    mask = AttentionMask(causal=causal)
    seen = {}
    handle = m.o_proj.register_forward_hook(lambda mod, inp, out: seen.update(o=inp[0]))
    full = _run(m, x, mask).out
    handle.remove()
    o = seen["o"].clone()  # (B, T, H*Dh): the routed head's columns first
    o[..., :8] = 0
    assert seen["o"][..., :8].abs().max() > 1e-3  # the routed head did contribute
    assert_close(_run(muted, x, mask).out, m.o_proj(o), rtol=1e-12, atol=1e-12)
    assert (full - _run(muted, x, mask).out).abs().max() > 1e-3
    with torch.no_grad():  # the routed head's query and value rows (first 8) change nothing
        muted.q_proj.weight[:8] += 1.0
        muted.v_proj.weight[:8] += 1.0
    assert_close(_run(muted, x, mask).out, m.o_proj(o), rtol=1e-12, atol=1e-12)


def test_mute_routed_must_be_a_bool():
    with pytest.raises(ConfigError, match="mute_routed"):
        RoutingConfig(mute_routed=1)


@pytest.mark.parametrize("causal", [True, False])
def test_local_heads_see_their_own_block_and_the_previous_one_exactly(causal):
    # issue 23: a mutant whose local heads drop the previous block was caught only by a memory
    # test. Local heads only (routing_heads=0), window 8: a query in block 1 (positions 8..15)
    # reads block 0; a query in block 2 does not (and, bidirectional, reads block 3 too).
    cfg = RoutingConfig(routing_heads=0, window=8)
    m = _part(cfg, dim=16, heads=2, causal=causal).double().eval()
    mask = AttentionMask(causal=causal)
    x = torch.randn(1, 32, 16, dtype=torch.float64)

    def moved(pos):
        x2 = x.clone()
        x2[0, pos] += 1.0
        return (_run(m, x2, mask).out - _run(m, x, mask).out).abs().amax(-1)[0]  # (T,)

    d = moved(2)  # a key in block 0
    assert d[10] > 1e-6 and d[15] > 1e-6  # block 1 reads its previous block
    assert_close(d[16:], torch.zeros(16, dtype=torch.float64), rtol=0, atol=0)
    d = moved(12)  # a key in block 1
    assert d[16] > 1e-6 and d[23] > 1e-6  # block 2 reads block 1
    assert_close(d[24:], torch.zeros(8, dtype=torch.float64), rtol=0, atol=0)
    if causal:
        assert_close(d[:12], torch.zeros(12, dtype=torch.float64), rtol=0, atol=0)
    else:
        assert d[0] > 1e-6  # bidirectional: block 0 reads the next block too


# ----------------------------------------------------------- strided paths (memory-lean nodes)


def _dense_clusters(q, k, v, q_idx, k_idx, causal, scale):
    """Routed attention on full (T, T) tensors: for each cluster c, its queries attend to its
    keys (positions <= i when causal) by a masked softmax; a token's output is the mean over the
    clusters choosing it as a query, zero when none does. (B, H, T, Dh)."""
    b, h, t, _ = v.shape
    s = scale * q @ k.transpose(-1, -2)  # (B, H, T, T)
    later = torch.ones(t, t, dtype=torch.bool).triu(1)
    total = torch.zeros_like(v)
    count = torch.zeros(b, h, t, 1, dtype=v.dtype)
    for c in range(q_idx.shape[2]):
        qm = torch.zeros(b, h, t, dtype=torch.bool).scatter(2, q_idx[:, :, c], True)
        km = torch.zeros(b, h, t, dtype=torch.bool).scatter(2, k_idx[:, :, c], True)
        keep = qm[..., :, None] & km[..., None, :]
        if causal:
            keep = keep & ~later
        p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
        total = total + p @ v
        count = count + qm[..., None].to(v.dtype)
    return total / count.clamp_min(1.0)


@pytest.mark.parametrize("shared,causal", [(True, True), (True, False), (False, False)])
def test_strided_routed_attention_equals_the_dense_cluster_reference(shared, causal):
    # T=64, 12 clusters of 9 (six groups of two in the strided node): some tokens chosen by
    # several clusters, some by none; forward and gradients, float64.
    g = torch.Generator().manual_seed(5)
    b, h, t, dh, kc, w = 2, 2, 64, 8, 12, 9
    mu = normalize_qk(torch.randn(h, kc, dh, generator=g, dtype=torch.float64), "layernorm")
    q0 = torch.randn(b, h, t, dh, generator=g, dtype=torch.float64)
    k0 = torch.randn(b, h, t, dh, generator=g, dtype=torch.float64)
    v0 = torch.randn(b, h, t, dh, generator=g, dtype=torch.float64)
    grad = torch.randn(b, h, t, dh, generator=g, dtype=torch.float64)
    q_idx = route(torch.einsum("bhtd,hkd->bhkt", q0, mu), w)
    k_idx = q_idx if shared else route(torch.einsum("bhtd,hkd->bhkt", k0, mu), w)
    results = []
    for path in ("dense", False, True):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        kk = q if shared else k
        if path == "dense":
            o = _dense_clusters(q, kk, v, q_idx, k_idx, causal, 0.7)
        else:
            o = routed_attention(q, kk, v, q_idx, k_idx, causal=causal, scale=0.7, strided=path)
        inputs = (q, v) if shared else (q, k, v)
        results.append((o, torch.autograd.grad(o, inputs, grad)))
    (o_ref, g_ref), *paths = results
    for o, grads in paths:
        assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
        for a, want in zip(grads, g_ref, strict=True):
            assert_close(a, want, rtol=1e-12, atol=1e-12)


def test_strided_routed_attention_passes_gradcheck_and_names_what_it_cannot_take():
    g = torch.Generator().manual_seed(6)
    q, v = (torch.randn(1, 2, 10, 3, generator=g, dtype=torch.float64) for _ in range(2))
    idx = route(torch.randn(1, 2, 3, 10, generator=g), 4)
    q.requires_grad_(), v.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, v: routed_attention(q, q, v, idx, idx, causal=True, scale=0.5, strided=True),
        (q, v),
    )
    other = route(torch.randn(1, 2, 3, 10, generator=g), 4)
    with pytest.raises(ValueError, match="unshared indices"):
        routed_attention(q, v, v, idx, other, causal=True, strided=True)
    with pytest.raises(ValueError, match="key padding"):
        real = torch.ones(1, 10, dtype=torch.bool)
        routed_attention(q, q, v, idx, idx, causal=True, real=real, strided=True)


def _gathered_only(monkeypatch):
    """Route every call of the local and routed attention to the gathered path."""
    import effiformer.attention.local as local_mod
    import effiformer.attention.routing as routing_mod

    def never(*args, **kwargs):
        return "forced off by the test"

    monkeypatch.setattr(local_mod, "strided_unavailable", never)
    monkeypatch.setattr(routing_mod, "strided_unavailable", never)


@pytest.mark.parametrize("share_qk", [True, False])
def test_layer_with_strided_paths_equals_the_gathered_layer(share_qk, monkeypatch):
    # One training-mode layer at T=200 (13 local blocks of 16; 10 clusters of 20): output, aux,
    # updates and every gradient agree with the gathered implementation (float64).
    cfg = RoutingConfig(
        routing_heads=2, window=16, clusters=10, share_qk=share_qk, qk_norm="layernorm"
    )
    x0 = torch.randn(2, 200, 32, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    runs = []
    for gathered in (False, True):
        if gathered:
            _gathered_only(monkeypatch)
        m = _part(cfg, dim=32, heads=4, causal=share_qk, max_len=200).double().train()
        x = x0.clone().requires_grad_()
        res = _run(m, x, AttentionMask(causal=share_qk))
        (res.out.square().sum() + res.aux["commitment"]).backward()
        grads = {"x": x.grad, **{n: p.grad for n, p in m.named_parameters()}}
        runs.append((res, grads))
    (a, ga), (b, gb) = runs
    assert_close(a.out, b.out, rtol=1e-12, atol=1e-12)
    assert_close(a.aux["commitment"], b.aux["commitment"], rtol=1e-12, atol=0)
    for key in b.updates:
        assert_close(a.updates[key], b.updates[key], rtol=1e-12, atol=1e-12)
    assert set(ga) == set(gb)
    for n in gb:
        assert_close(ga[n], gb[n], rtol=1e-10, atol=1e-12)


def test_layer_keeps_the_projection_and_attention_outputs_only_for_the_backward(monkeypatch):
    # The autograd graph of one layer (2 local + 2 routing heads, T=1024, Dh 8, float64) keeps,
    # in head-widths of T rows: the fused projection (q 4, k 2, v 4), the o_proj input (4), the
    # local output (2), the per-cluster routed outputs (2), the normalised queries (2) and the
    # commitment target (2): 22, plus per-row statistics (log-sum-exps, LayerNorm mean and rstd,
    # counts: 1/8 head-width each at Dh 8) and the stacked weights. The gathered implementation
    # also keeps copies of q, k, v, the (chunks, 2w) neighbour tiles and the gathered clusters.
    t, dh = 1024, 8
    cfg = RoutingConfig(routing_heads=2, window=64, clusters=32)

    def saved_bytes():
        m = _part(cfg, dim=32, heads=4, max_len=t).double().train()
        x = torch.randn(1, t, 32, dtype=torch.float64, requires_grad=True)
        storages = {}

        def pack(z):
            st = z.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
            return z

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda z: z):
            res = _run(m, x, AttentionMask(causal=True))
        assert res.out.shape == x.shape
        storages.pop(x.untyped_storage().data_ptr(), None)
        return sum(storages.values())

    head_width = t * dh * 8
    lean = saved_bytes()
    assert lean <= 24 * head_width
    _gathered_only(monkeypatch)
    gathered = saved_bytes()
    assert gathered >= 1.5 * lean


# ------------------------------------------------------------------------------- k-means


def test_kmeans_ema_update_matches_hand_arithmetic():
    x = torch.tensor([[[[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]]]])  # (1, 1, 4, 2)
    mu = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    weight = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is padding
    counts, sums, assign = kmeans_statistics(x, mu, weight)
    assert assign.tolist() == [[[0, 0, 1, 1]]]
    assert_close(counts, torch.tensor([[2.0, 1.0]]))
    assert_close(sums, torch.tensor([[[1.8, 0.6], [0.0, 1.0]]]))
    decay, eps = 0.9, 1e-5
    s0, n0 = mu.clone(), torch.zeros(1, 2)  # the official start: S = initial centroids, N = 0
    assert_close(centroids_from(s0, n0, eps), mu)  # before any update: the initial centroids
    s1, n1 = ema_update(s0, n0, sums, counts, decay)
    assert_close(s1, torch.tensor([[[0.9 + 0.18, 0.06], [0.0, 0.9 + 0.1]]]))
    assert_close(n1, torch.tensor([[0.2, 0.1]]))
    total = 0.2 + 0.1
    smooth = [(0.2 + eps) / (total + 2 * eps) * total, (0.1 + eps) / (total + 2 * eps) * total]
    want = torch.tensor([[[1.08 / smooth[0], 0.06 / smooth[0]], [0.0, 1.0 / smooth[1]]]])
    assert_close(centroids_from(s1, n1, eps), want)


def _blob_part(heads, dh, clusters, decay):
    cfg = RoutingConfig(
        routing_heads=heads, clusters=clusters, qk_norm="l2", decay=decay, cluster_window=8
    )
    m = _part(cfg, dim=heads * dh, heads=heads, seed=3)
    with torch.no_grad():
        m.q_proj.weight.copy_(torch.eye(heads * dh))  # q = x: the blobs are what is clustered
    return m.train()


def test_centroids_find_unit_norm_blobs_within_50_steps():
    # 4 blobs per head, 8 centroids (k-means without reseeding can park a spare centroid
    # between blobs from a random start; with spares every blob is found), decay 0.9.
    heads, dh, n_blobs = 2, 16, 4
    g = torch.Generator().manual_seed(0)
    centres = F.normalize(torch.randn(heads, n_blobs, dh, generator=g), dim=-1)
    m = _blob_part(heads, dh, 8, 0.9)
    mask = AttentionMask(causal=True)
    before = m.centroids().clone()
    for _ in range(50):
        lab = torch.randint(0, n_blobs, (4, 64, heads), generator=g)
        x = centres[torch.arange(heads)[None, None, :], lab]  # (B, T, H, Dh)
        x = F.normalize(x + 0.3 * torch.randn(x.shape, generator=g) / dh**0.5, dim=-1)
        out = _run(m, x.reshape(4, 64, heads * dh), mask)
        with torch.no_grad():
            for name, value in out.updates.items():
                getattr(m, name).copy_(value)
    mu = F.normalize(m.centroids(), dim=-1)
    cos = torch.einsum("hkd,hjd->hkj", mu, centres)  # (H, K, blobs)
    used = m.ema_counts / m.ema_counts.sum(-1, keepdim=True)  # each centroid's share of tokens
    assert float((cos.max(-1).values * used).sum(-1).min()) > 0.95  # used centroids sit on blobs
    assert float(cos.max(-2).values.mean()) > 0.95  # and every blob has its centroid
    start = torch.einsum("hkd,hjd->hkj", F.normalize(before, dim=-1), centres)
    assert float(start.max(-2).values.mean()) < 0.8  # it was not there from the start


def test_update_averaging_over_ranks_equals_the_all_reduced_ema():
    # Two ranks (or micro-batches) average their updates; the official code all-reduces the
    # statistics. With the state in per-contribution units (S/2, N/2) the averaged update is
    # (S', N') / 2 of the official all-reduced EMA, so the centroids agree; averaging centroids
    # would not.
    heads, dh, k, decay = 2, 8, 4, 0.9
    m = _blob_part(heads, dh, k, decay)
    g = torch.Generator().manual_seed(5)
    s = torch.randn(heads, k, dh, generator=g)
    n = torch.rand(heads, k, generator=g) * 10 + 1
    with torch.no_grad():
        m.ema_sums.copy_(s / 2)
        m.ema_counts.copy_(n / 2)
    x1, x2 = (torch.randn(3, 32, heads * dh, generator=g) for _ in range(2))
    mask = AttentionMask(causal=True)
    u1, u2 = _run(m, x1, mask).updates, _run(m, x2, mask).updates
    avg = {key: (u1[key] + u2[key]) / 2 for key in u1}
    eps = m.config.epsilon
    xn = F.normalize(torch.cat([x1, x2]).view(6, 32, heads, dh).transpose(1, 2), dim=-1)
    counts, sums, _ = kmeans_statistics(xn, m.centroids())  # the global batch's statistics
    s_all, n_all = ema_update(s, n, sums, counts, decay)  # all-reduce, then one EMA step
    official = centroids_from(s_all, n_all, eps)
    assert_close(centroids_from(avg["ema_sums"], avg["ema_counts"], eps), official)
    naive = (
        centroids_from(u1["ema_sums"], u1["ema_counts"], eps)
        + centroids_from(u2["ema_sums"], u2["ema_counts"], eps)
    ) / 2
    assert not torch.allclose(naive, official, rtol=1e-3, atol=1e-3)


def test_unshared_qk_kmeans_statistics_are_the_mean_of_the_query_and_key_terms():
    # issue 23: with separate keys the k-means statistics average the query and key terms (the
    # official update); a mutant that sums them passed every test. With k_proj = q_proj the
    # average equals the shared-QK statistics of the same queries, the sum twice them.
    cfg = RoutingConfig(routing_heads=2, window=8, clusters=4, cluster_window=8)
    a = _part(dataclasses.replace(cfg, share_qk=False), dim=16, heads=2, causal=False).double()
    b = _part(dataclasses.replace(cfg, share_qk=True), dim=16, heads=2, causal=False).double()
    with torch.no_grad():
        a.k_proj.weight.copy_(a.q_proj.weight)
        for name in ("q_proj", "v_proj", "o_proj"):
            getattr(b, name).load_state_dict(getattr(a, name).state_dict())
        b.ema_sums.copy_(a.ema_sums)
        b.ema_counts.copy_(a.ema_counts)
    a.train(), b.train()
    x = torch.randn(2, 32, 16, dtype=torch.float64)
    mask = AttentionMask(causal=False)
    ua, ub = _run(a, x, mask).updates, _run(b, x, mask).updates
    assert_close(ua["ema_counts"], ub["ema_counts"], rtol=1e-12, atol=1e-12)
    assert_close(ua["ema_sums"], ub["ema_sums"], rtol=1e-12, atol=1e-12)
    assert not torch.equal(ub["ema_counts"], b.ema_counts)  # the update moved them


def test_centroids_are_buffers_frozen_in_eval_and_outside_the_optimiser():
    torch.manual_seed(0)
    model = create_model("routing-tiny")
    names = [n for n, _ in model.named_buffers() if ".ema_" in n]
    assert names == ["blocks.1.attn.ema_sums", "blocks.1.attn.ema_counts"]
    assert not any(".ema_" in n for n, _ in model.named_parameters())
    assert set(names) <= set(model.state_dict())  # saved in checkpoints
    ids = torch.randint(0, 256, (2, 64))
    before = {n: b.clone() for n, b in model.named_buffers()}
    model.eval()
    out = model(ids, targets=ids)
    assert out.updates == {} and out.aux == {}
    model.train()
    out = model(ids, targets=ids)
    assert set(out.updates) == set(names) and set(out.aux) == {"blocks.1.commitment"}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out.total_loss.backward()
    opt.step()
    for n, b in model.named_buffers():
        assert not b.requires_grad and b.grad is None
        assert torch.equal(b, before[n]), n  # only apply_updates moves them
    model.apply_updates(out.updates)
    assert not torch.equal(model.blocks[1].attn.ema_counts, before["blocks.1.attn.ema_counts"])
    assert_close(model.blocks[1].attn.ema_sums, out.updates["blocks.1.attn.ema_sums"])


@pytest.mark.parametrize("shared", [True, False])
def test_commitment_loss_reaches_only_q_and_k(shared):
    cfg = RoutingConfig(routing_heads=1, window=8, clusters=4, share_qk=shared)
    m = _part(cfg, dim=16, heads=2).train()
    x = torch.randn(2, 32, 16, requires_grad=True)
    out = _run(m, x, AttentionMask(causal=True))
    (out.aux["commitment"] / m.config.commitment).backward()
    dh = 8
    gq = m.q_proj.weight.grad
    assert gq[:dh].abs().sum() > 0 and bool((gq[dh:] == 0).all())  # routing head's q only

    def untouched(p):  # no gradient (None, or exact zeros: Q, K, V share one matmul)
        return p.grad is None or bool((p.grad == 0).all())

    gk = m.k_proj.weight.grad
    if shared:
        assert untouched(m.k_proj.weight)  # keys of the local head
    else:
        assert gk[:dh].abs().sum() > 0 and bool((gk[dh:] == 0).all())
    assert untouched(m.v_proj.weight) and m.o_proj.weight.grad is None
    assert x.grad is not None and x.grad.abs().sum() > 0  # through q (and k) to the input


def test_skip_first_layers_are_all_local():
    cfg = get_config("routing-pg19").attention
    heads = [cfg.for_layer(i, 22).routing_heads for i in range(22)]
    assert heads == [0] * 21 + [2]  # only the last layer routes
    torch.manual_seed(0)
    model = create_model("routing-tiny")
    first, second = model.blocks[0].attn, model.blocks[1].attn
    assert first.n_routing == 0 and first.n_local == 2 and not hasattr(first, "ema_sums")
    assert second.n_routing == 1 and second.n_local == 1 and second.ema_sums.shape == (1, 4, 32)


def test_named_configurations_follow_the_released_hyperparameters():
    e = get_config("routing-enwik8")
    assert (e.n_layers, e.dim, e.n_heads, e.seq_len, e.vocab_size) == (12, 1024, 8, 8192, 256)
    a = e.attention
    assert (a.routing_heads, a.clusters, a.cluster_window, a.window, a.skip_first) == (
        4, 16, 512, 256, 0
    )  # fmt: skip
    assert (a.decay, a.commitment, a.share_qk, a.qk_norm) == (0.999, 1e-4, None, "layernorm")
    w = get_config("routing-wikitext103")
    assert (w.n_layers, w.dim, w.embed_dim, w.n_heads) == (14, 1024, 256, 16)
    # basic_params1's sublayer dropout 0.1; the config's attention and FFN dropouts 0.4
    assert (w.dropout, w.attn_dropout, w.ffn_dropout) == (0.1, 0.4, 0.4)
    assert (w.attention.routing_heads, w.attention.clusters, w.attention.cluster_window) == (
        8, 8, 512
    )  # fmt: skip
    # relative positions only, emb_dense, norm_epsilon 1e-6; WikiText-103's input dropouts
    assert (w.token_dropout, w.embed_dropout) == (0.25, 0.4)
    p = get_config("routing-pg19")
    assert (p.n_layers, p.dim, p.n_heads, p.head_dim, p.ffn_dim) == (22, 1032, 8, 129, 4096)
    for c in (e, w, p):
        assert (c.positions, c.norm_eps, c.embed_dense) == ("none", 1e-6, True)
        assert c.attention.max_relative_position == 513
    assert (e.token_dropout, e.embed_dropout, p.token_dropout) == (0.0, 0.0, 0.0)
    s, v = get_config("routing-small"), get_config("vanilla-small")
    assert (s.dim, s.n_heads, s.n_layers, s.ffn_dim, s.seq_len) == (
        v.dim, v.n_heads, v.n_layers, v.ffn_dim, v.seq_len
    )  # fmt: skip


def test_recomputation_keeps_the_first_forwards_updates_and_gradients():
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    outs, grads = [], []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = create_model("routing-tiny", recompute=recompute).train()
        out = model(ids, targets=ids)
        out.total_loss.backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert set(outs[0].updates) == set(outs[1].updates)
    for key in outs[0].updates:
        assert_close(outs[1].updates[key], outs[0].updates[key], rtol=0, atol=0)
    for n in grads[0]:
        assert_close(grads[1][n], grads[0][n], rtol=1e-6, atol=1e-7)


def test_config_errors_name_the_field():
    cases = [
        (dict(window=0), "attention.window"),
        (dict(clusters=0), "attention.clusters"),
        (dict(cluster_window=-1), "attention.cluster_window"),
        (dict(routing_heads=-1), "attention.routing_heads"),
        (dict(qk_norm="cosine"), "attention.qk_norm"),
        (dict(decay=1.0), "attention.decay"),
        (dict(epsilon=0.0), "attention.epsilon"),
        (dict(scale=0.0), "attention.scale"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ConfigError, match=field):
            RoutingConfig(**kwargs)
    with pytest.raises(ConfigError, match="routing_heads=3 exceeds the model's n_heads=2"):
        create_model("routing-tiny", **{"attention.routing_heads": 3})
    over = parse_overrides(
        get_config("routing-tiny"), ["attention.share_qk=false", "attention.clusters=none"]
    )
    assert over["attention"].share_qk is False and over["attention"].clusters is None
    over = parse_overrides(VanillaConfig, ["attention.name=routing", "attention.qk_norm=l2"])
    assert over["attention"] == RoutingConfig(qk_norm="l2")


# ------------------------------------------------------------------------------------ DDP

WORKER = Path(__file__).with_name("routing_ddp_worker.py")


def test_two_process_ddp_keeps_the_centroids_identical(tmp_path):
    text = tmp_path / "text.txt"
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    g = torch.Generator().manual_seed(0)
    text.write_text(
        "\n".join(
            " ".join(words[i] for i in torch.randint(0, 8, (9,), generator=g)) for _ in range(300)
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    one = [sys.executable, str(WORKER), str(text), str(tmp_path / "one"), "2"]
    two = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
        str(WORKER), str(text), str(tmp_path / "two"), "1",
    ]  # fmt: skip
    for cmd in (one, two):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = torch.load(tmp_path / "two" / "rank0.pt")
    r1 = torch.load(tmp_path / "two" / "rank1.pt")
    single = torch.load(tmp_path / "one" / "rank0.pt")
    init = torch.load(tmp_path / "one" / "init.pt")
    assert set(r0) == set(r1) == set(single) and r0
    for key in r0:
        assert torch.equal(r0[key], r1[key]), key  # identical on both processes
        # the same as one process taking the same global batch in two micro-batches
        assert_close(r0[key], single[key], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(r0[key], init[key])  # and they did move


# ------------------------------------------------------------------------------- bench


def _spec(name: str, t: int, **overrides):
    from effiformer.bench.references import CellSpec

    config = get_config(name, seq_len=t, **overrides)
    return CellSpec(
        name=name, config=config, part="attention", seq_len=t, batch=1,
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip


def test_reference_row_takes_the_clusters_and_window_of_our_first_layer():
    from effiformer.bench import routing_references as rr
    from effiformer.bench.references import list_references

    rows = [r for r in list_references() if r.name == "routing-transformer"]
    assert [(r.target, r.attention) for r in rows] == [("*", ("routing",))]
    spec = _spec("routing-small", 4096, **{"attention.window": 256})
    shape = rr.routing_layer_shape(spec)
    torch.manual_seed(0)
    part = create_model("routing-small", seq_len=4096, **{"attention.window": 256}).blocks[0].attn
    assert shape == {
        "routing_heads": part.n_routing,
        "local_heads": part.n_local,
        "clusters": part.n_clusters,
        "cluster_window": part.cluster_window(4096),
        "window": 256,
        "share_qk": part.share_qk,
    }
    assert (shape["clusters"], shape["cluster_window"]) == (64, 64)
    with pytest.raises(ValueError, match="routing attention only"):
        rr.routing_layer_shape(_spec("vanilla-small", 256))
    with pytest.raises(ValueError, match="no routing heads"):
        rr.routing_layer_shape(_spec("routing-tiny", 128))  # skip_first=1
    pytest.importorskip("routing_transformer")
    wl = rr.routing_transformer_reference(_spec("routing-small", 512))
    out = wl.forward()
    assert out.shape == (1, 512, 256)
    wl.step_loss(out).backward()


def test_routing_vs_vanilla_script_records_both_models(tmp_path, data_env):
    data_env("tinyshakespeare/input.txt")  # the script's corpus
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "routing_vs_vanilla.py"
    spec = importlib.util.spec_from_file_location("bench_routing_vs_vanilla", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        assert module.main([
            "--steps", "2", "--seq-len", "32", "--batch", "2", "--window", "8",
            "--eval-tokens", "128", "--eval-batch", "2", "--out", str(tmp_path),
            "--set", "dim=32", "n_heads=2", "n_layers=1", "ffn_dim=64",
        ]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "environment"
    assert [r["model"] for r in lines[1:]] == ["vanilla-small", "routing-small"]
    assert all(r["steps"] == 2 and r["val_bpc"] > 0 for r in lines[1:])


def test_shared_qk_commitment_is_the_official_sum_of_the_query_and_key_terms():
    """Issue 23: the official loss adds a query and a key term; under shared QK the keys are the
    queries, so the loss is twice the query term. An unshared layer whose routing keys are
    projected by the query weights must give the same loss and k-means statistics."""
    cfg = RoutingConfig(routing_heads=1, window=8, clusters=4)
    shared = _part(RoutingConfig(**{**cfg.__dict__, "share_qk": True})).train()
    unshared = _part(RoutingConfig(**{**cfg.__dict__, "share_qk": False}), seed=1).train()
    dh = 8
    with torch.no_grad():
        for name in ("q_proj", "v_proj", "o_proj"):
            getattr(unshared, name).weight.copy_(getattr(shared, name).weight)
        unshared.k_proj.weight[:dh] = shared.q_proj.weight[:dh]  # routing keys = queries
        unshared.k_proj.weight[dh:] = shared.k_proj.weight  # the local head's keys
        unshared.ema_sums.copy_(shared.ema_sums)
        unshared.ema_counts.copy_(shared.ema_counts)
    x = torch.randn(2, 32, 16)
    a = _run(shared, x, AttentionMask(causal=True))
    b = _run(unshared, x, AttentionMask(causal=True))
    assert_close(a.out, b.out)
    assert_close(a.aux["commitment"], b.aux["commitment"])
    for k in a.updates:
        assert_close(a.updates[k], b.updates[k])


@pytest.mark.parametrize("qk_norm,expected", [("layernorm", 1.0), ("l2", 8.0)])
def test_the_default_routing_scale_gives_the_official_logits(qk_norm, expected):
    """Issue 23: unit l2 vectors with scale 1 gave cosines in [-1, 1] (a near-uniform attention);
    the default is d_head there, the logits LayerNorm'd vectors (norm sqrt(d_head)) give at 1."""
    m = _part(RoutingConfig(routing_heads=1, window=8, clusters=4, qk_norm=qk_norm))
    assert m.scale == expected
    assert _part(RoutingConfig(routing_heads=1, qk_norm=qk_norm, scale=3.0)).scale == 3.0


# ------------------------------------------------------------------ relative positions (T2T)


def _relative_oracle(q, k, v, keep, dist, a_k, a_v, scale):
    """One query row at a time: softmax over the kept keys of scale * q.(k_j + a_K[d_ij]),
    output sum_j w_j (v_j + a_V[d_ij]); dist (Lq, Lk) clipped-and-shifted table rows."""
    out = torch.zeros(q.shape[0], v.shape[-1], dtype=q.dtype)
    for i in range(q.shape[0]):
        js = [j for j in range(k.shape[0]) if keep[i, j]]
        if not js:
            continue
        logits = torch.stack([scale * q[i] @ (k[j] + a_k[dist[i, j]]) for j in js])
        w = torch.softmax(logits, 0)
        out[i] = sum(w[n] * (v[j] + a_v[dist[i, j]]) for n, j in enumerate(js))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_relative_positions_equal_a_per_query_oracle_in_both_head_types(causal):
    """Local heads: token distance j - i inside their own block and the previous (and next)
    one; routing heads: the rank difference inside each cluster's position-sorted window, the
    official sparsity_cluster_relative (a mutant using token distances there fails), clipped
    to +-M; outputs of several clusters averaged. Full tensors, float64."""
    t, m_rel, window = 24, 3, 8
    cfg = RoutingConfig(
        routing_heads=1, window=window, clusters=3, cluster_window=10, max_relative_position=m_rel
    )
    m = _part(cfg, causal=causal, max_len=t).double().eval()
    with torch.no_grad():  # tables far from zero, so every term counts
        for tab in (m.rel_local, m.rel_routing):
            tab.keys.normal_()
            tab.values.normal_()
    x = torch.randn(2, t, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mask = AttentionMask(causal=causal)
    out = _run(m, x, mask).out
    dh = 8
    q = m.q_proj(x).view(2, t, 2, dh).transpose(1, 2)
    k = m.k_proj(x).view(2, t, -1, dh).transpose(1, 2)
    v = m.v_proj(x).view(2, t, 2, dh).transpose(1, 2)
    pos = torch.arange(t)
    clip = lambda d: d.clamp(-m_rel, m_rel) + m_rel  # noqa: E731
    heads = torch.zeros(2, 2, t, dh, dtype=torch.float64)
    with torch.no_grad():
        # the local head (index 1): blocks of 8, own and previous block (and next: bidirectional)
        blk = pos // window
        near = (blk[None, :] - blk[:, None] >= -1) & (
            blk[None, :] - blk[:, None] <= (0 if causal else 1)
        )
        keep = near & ((pos[None, :] <= pos[:, None]) if causal else True)
        dist = clip(pos[None, :] - pos[:, None])
        for b in range(2):
            heads[b, 1] = _relative_oracle(
                q[b, 1], k[b, -1], v[b, 1], keep, dist, m.rel_local.keys, m.rel_local.values,
                dh**-0.5,
            )  # fmt: skip
        # the routing head (index 0): shared QK when causal, LayerNorm'd, clusters of 10
        qn = normalize_qk(q[:, :1], "layernorm")
        kn = qn if causal else normalize_qk(k[:, :1], "layernorm")
        mu = m.centroids()
        q_idx = route((qn @ mu.transpose(-1, -2)).transpose(-1, -2), 10)
        k_idx = q_idx if causal else route((kn @ mu.transpose(-1, -2)).transpose(-1, -2), 10)
        for b in range(2):
            total = torch.zeros(t, dh, dtype=torch.float64)
            count = torch.zeros(t)
            for c in range(3):
                qi, ki = q_idx[b, 0, c], k_idx[b, 0, c]
                ranks = torch.arange(10)
                keep_c = (
                    (ki[None, :] <= qi[:, None]) if causal else torch.ones(10, 10, dtype=torch.bool)
                )
                o = _relative_oracle(
                    qn[b, 0, qi], kn[b, 0, ki], v[b, 0, ki], keep_c,
                    clip(ranks[None, :] - ranks[:, None]), m.rel_routing.keys,
                    m.rel_routing.values, 1.0,
                )  # fmt: skip
                total[qi] += o
                count[qi] += 1
            heads[b, 0] = total / count.clamp_min(1)[:, None]
        want = m.o_proj(heads.transpose(1, 2).reshape(2, t, 16))
    assert_close(out, want, rtol=1e-10, atol=1e-10)


def test_zero_relative_tables_give_the_layer_without_them():
    """The degenerate limit of the tables: all zeros is the plain layer, weight for weight
    (local heads through SDPA, routing heads through the strided kernel there)."""
    base = RoutingConfig(routing_heads=1, window=8, clusters=3, cluster_window=10)
    plain = _part(base, max_len=24).double().eval()
    rel = _part(dataclasses.replace(base, max_relative_position=4), max_len=24).double().eval()
    with torch.no_grad():
        for tab in (rel.rel_local, rel.rel_routing):
            tab.keys.zero_()
            tab.values.zero_()
    missing = rel.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing.missing_keys) == [
        "rel_local.keys", "rel_local.values", "rel_routing.keys", "rel_routing.values"
    ]  # fmt: skip
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    mask = AttentionMask(causal=True)
    assert_close(_run(rel, x, mask).out, _run(plain, x, mask).out, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        rel.rel_local.keys.normal_()
    assert (_run(rel, x, mask).out - _run(plain, x, mask).out).abs().max() > 1e-3


def test_relative_tables_start_as_the_released_initializer_and_train():
    """uniform_unit_scaling with gain 0.2 over 2M + 1 rows, kept by the model's init loop; the
    LM's loss reaches them."""
    model = create_model(
        "routing-tiny", attention=RoutingConfig(
            routing_heads=1, skip_first=1, window=32, clusters=4, max_relative_position=513
        ),
    )  # fmt: skip
    tab = model.blocks[1].attn.rel_routing.keys
    bound = 0.2 * math.sqrt(3 / 1027)
    assert tab.shape == (1027, 32) and tab.abs().max() <= bound and tab.abs().max() > 0.9 * bound
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    model(ids, targets=ids).loss.backward()
    for block in model.blocks:
        for name in ("rel_local", "rel_routing"):
            tabs = getattr(block.attn, name)
            if tabs is not None:
                assert tabs.keys.grad.abs().sum() > 0 and tabs.values.grad.abs().sum() > 0
