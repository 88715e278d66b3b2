"""Sparse Transformer attention (Child et al. 2019): the patterns, the tiled O(n sqrt n) path
against the dense masked path, the ways of combining the steps, and the fidelity of one layer."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch.testing import assert_close

import effiformer.ops.tiled_sparse as tiled_sparse
from effiformer import create_model
from effiformer.attention import AttentionDims, AttentionMask, PrepareContext
from effiformer.attention.sparse import (
    SparseAttention,
    SparseConfig,
    build_plan,
    head_roles,
    masked_attention,
    pattern_mask,
    tiled_attention,
)
from effiformer.config import ConfigError

MODES = [True, False]  # causal, bidirectional


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _layer(config, *, causal, dim=32, heads=4, dtype=torch.float64, seed=0):
    dims = AttentionDims(dim, heads, dim // heads, causal=causal, layer=0, n_layers=1)
    torch.manual_seed(seed)
    return SparseAttention.from_config(config, dims).to(dtype).eval()


def _run(layer, x, mask):
    ctx = PrepareContext(tq=x.shape[1], tk=x.shape[1], mask=mask, device=x.device, dtype=x.dtype)
    return layer(x, mask=mask, positions=layer.prepare(ctx, None)).out


def _reach(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Positions reachable through a then b: (a @ b) > 0 as booleans (T, T)."""
    return (a.double() @ b.double()) > 0


# ------------------------------------------------------------------------------ the patterns


@pytest.mark.parametrize("causal", MODES)
def test_strided_a1_is_the_previous_l_positions_the_codes_convention(causal):
    # A1 = {i - l < j <= i}: l elements (openai/sparse_attention's local window), not the
    # paper's l + 1; A2 = {(i - j) mod l == 0}.
    st, t = 8, 64
    a1 = pattern_mask(SparseConfig(pattern="strided", stride=st, combine="a1"), t, 1, causal=causal)
    a2 = pattern_mask(SparseConfig(pattern="strided", stride=st, combine="a2"), t, 1, causal=causal)
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    want1 = (i - j < st) & (j - i < st) & ((j <= i) if causal else True)
    want2 = ((i - j) % st == 0) & ((j <= i) if causal else True)
    assert torch.equal(a1[0], want1) and torch.equal(a2[0], want2)
    if causal:
        assert a1[0].sum(-1).tolist() == [min(r + 1, st) for r in range(t)]


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("causal", MODES)
def test_rows_hold_order_sqrt_n_keys(pattern, causal):
    st, c, heads = 16, 4, 2
    n = st * st
    cfg = SparseConfig(pattern=pattern, stride=st, summary=c, num_verts=2)
    keep = pattern_mask(cfg, n, heads, causal=causal)  # (H, n, n)
    most = keep.sum(-1).max().item()
    # A1: at most 2l - 1 keys (bidirectional strided), A2: n / l (strided) or c * n / l (fixed).
    bound = (2 * st - 1) + (n // st if pattern == "strided" else c * n // st)
    assert most <= bound
    assert most < n / 3  # far from dense at this size already
    # The bound is O(sqrt(n)): the same configuration at 4x the length holds about 2x the keys.
    big = pattern_mask(dataclasses.replace(cfg, stride=2 * st), 4 * n, 1, causal=causal)
    assert big.sum(-1).max().item() <= 2.1 * most


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("causal", MODES)
def test_two_steps_reach_every_earlier_position_when_n_is_l_squared(pattern, causal):
    st = 8
    n = st * st
    cfg = SparseConfig(pattern=pattern, stride=st, summary=2, num_verts=1)
    a1 = pattern_mask(dataclasses.replace(cfg, combine="a1"), n, 1, causal=causal)[0]
    a2 = pattern_mask(dataclasses.replace(cfg, combine="a2"), n, 1, causal=causal)[0]
    full = torch.ones(n, n, dtype=torch.bool)
    want = full.tril() if causal else full
    for first, second in ((a1, a2), (a2, a1)) if pattern == "strided" else ((a2, a1),):
        # Layer A then layer B (the interleaved model), or one merged head attending twice.
        assert torch.equal(_reach(first, second) | first | second, want)
    merged = a1 | a2
    assert torch.equal(_reach(merged, merged), want)
    assert not torch.equal(a1, want) and not torch.equal(a2, want)  # one step is not enough
    if pattern == "fixed":  # the last positions of each block are what carries the summary
        assert not torch.equal(_reach(a1, a2) | a1 | a2, want)


def test_heads_take_different_summary_sub_blocks_counted_from_the_end():
    st, c, heads = 16, 4, 4
    cfg = SparseConfig(pattern="fixed", stride=st, summary=c, num_verts=4, combine="a2")
    keep = pattern_mask(cfg, 64, heads, causal=False)
    cols = [sorted(set((torch.nonzero(keep[h, 0])[:, 0] % st).tolist())) for h in range(heads)]
    # head h: positions l - (h+1) c .. l - h c - 1 of every block (official num_verts/vertsize)
    assert cols == [list(range(st - (h + 1) * c, st - h * c)) for h in range(heads)]
    assert len({tuple(x) for x in cols}) == heads
    # num_verts=2 with 4 heads: heads cycle through 2 sub-blocks; num_verts=1: the last c.
    two = pattern_mask(dataclasses.replace(cfg, num_verts=2), 64, heads, causal=False)
    assert torch.equal(two[0], two[2]) and torch.equal(two[1], two[3])
    assert not torch.equal(two[0], two[1])
    one = pattern_mask(dataclasses.replace(cfg, num_verts=1), 64, heads, causal=False)
    assert set((torch.nonzero(one[3, 0])[:, 0] % st).tolist()) == set(range(st - c, st))
    # Split heads: the A2 heads (the last H//2) number their sub-blocks from 0.
    split = head_roles(dataclasses.replace(cfg, combine="split"), heads)
    assert [(r.a1, r.a2, r.sub_block if r.a2 else None) for r in split] == [
        (True, False, None),
        (True, False, None),
        (False, True, 0),
        (False, True, 1),
    ]


# ------------------------------------------------------------------------------ tiled == dense


CASES = list(
    itertools.product(["strided", "fixed"], ["merged", "split", "a1", "a2"], MODES, [False, True])
)


@pytest.mark.parametrize("pattern,combine,causal,padded", CASES)
def test_tiled_path_equals_the_dense_masked_path_forward_and_gradients(
    pattern, combine, causal, padded
):
    # T = 100 is not a multiple of l = 16 (tail padding); c = 4 with 2 sub-blocks over 4 heads.
    b, t, dim = 2, 100, 32
    cfg = SparseConfig(pattern=pattern, stride=16, summary=4, num_verts=2, combine=combine)
    tiled = _layer(cfg, causal=causal)
    dense = _layer(dataclasses.replace(cfg, impl="dense"), causal=causal)
    dense.load_state_dict(tiled.state_dict())
    real = None
    if padded:
        real = torch.ones(b, t, dtype=torch.bool)
        real[0, 90:] = False
        real[1, 37:] = False  # whole tiles and a column's tail are padding
    mask = AttentionMask(causal=causal, key_padding=real)
    x = torch.randn(b, t, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    for layer in (tiled, dense):
        xi = x.clone().requires_grad_()
        out = _run(layer, xi, mask)
        sel = out if real is None else out[real]
        sel.pow(2).sum().backward()
        outs.append(sel.detach())
        grads.append([xi.grad] + [p.grad for p in layer.parameters()])
    assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-10)
    for g0, g1 in zip(*grads):
        assert_close(g0, g1, rtol=1e-9, atol=1e-10)
    assert torch.isfinite(outs[0]).all()


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_tiled_path_matches_in_float32_with_a_tight_tolerance(pattern):
    b, t, h, dh = 1, 256, 4, 16
    cfg = SparseConfig(pattern=pattern, stride=16, summary=4, num_verts=4)
    plan = build_plan(cfg, h, t, causal=True)
    q, k, v = (torch.randn(b, t, h, dh, requires_grad=True) for _ in range(3))
    out = tiled_attention(q, k, v, plan)
    keep = pattern_mask(cfg, t, h, causal=True)[None]
    ref = masked_attention(*(z.transpose(1, 2) for z in (q, k, v)), keep).transpose(1, 2)
    assert_close(out, ref, rtol=1e-5, atol=2e-6)
    g = torch.randn_like(out)
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, r, rtol=1e-4, atol=1e-5)


def test_plain_matmul_kernel_equals_the_fused_cpu_kernel(monkeypatch):
    # Off CPU the tiles run through plain matmuls; the engine around them is the same.
    cfg = SparseConfig(pattern="strided", stride=8, combine="merged")
    real = torch.ones(2, 60, dtype=torch.bool)
    real[1, 41:] = False
    q, k, v = (torch.randn(2, 60, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    results = []
    for fused in (True, False):
        monkeypatch.setattr(tiled_sparse, "_use_cpu_flash", lambda _q, f=fused: f)
        plan = build_plan(cfg, 2, 60, causal=False, key_padding=real, dtype=torch.float64)
        out = tiled_attention(q, k, v, plan)
        results.append([out, *torch.autograd.grad(out.pow(2).sum(), (q, k, v))])
    for a, b in zip(*results):
        assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_tiled_attention_passes_gradcheck(pattern):
    cfg = SparseConfig(pattern=pattern, stride=4, summary=1, num_verts=2)
    real = torch.ones(1, 14, dtype=torch.bool)
    real[0, 12:] = False
    plan = build_plan(cfg, 2, 14, causal=False, key_padding=real, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 14, 2, 3, dtype=torch.float64, generator=g).requires_grad_()
        for _ in range(3)
    )
    assert torch.autograd.gradcheck(lambda a, b, c: tiled_attention(a, b, c, plan), (q, k, v))


# ------------------------------------------------------------------------------ limits, fidelity


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("causal", MODES)
def test_stride_at_least_the_length_gives_dense_attention(pattern, causal):
    t = 48
    cfg = SparseConfig(pattern=pattern, stride=8, summary=2)
    degenerate = SparseAttention.degenerate_config(cfg, t)
    assert degenerate.stride >= t
    layer = _layer(degenerate, causal=causal)
    x = torch.randn(2, t, 32, dtype=torch.float64)
    mask = AttentionMask(causal=causal)
    assert_close(_run(layer, x, mask), layer.dense_reference(x, mask=mask), rtol=1e-10, atol=1e-10)
    away = _layer(cfg, causal=causal)
    assert not torch.allclose(_run(away, x, mask), away.dense_reference(x, mask=mask), atol=1e-4)


def test_sparse_model_with_stride_at_least_the_length_equals_the_dense_model():
    sparse_model = create_model("sparse-tiny", **{"attention.stride": 128}).eval()
    dense_model = create_model(
        "sparse-tiny", attention={"name": "dense", "bias": True}
    ).eval()  # same family, same names: q_proj, k_proj, v_proj, o_proj
    dense_model.load_state_dict(sparse_model.state_dict())
    ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(0))
    assert_close(sparse_model(ids).logits, dense_model(ids).logits, rtol=1e-5, atol=1e-5)


def _one_layer_sensitivity(cfg, causal, t, query):
    """For every key position j: whether perturbing token j changes the output at ``query``."""
    layer = _layer(cfg, causal=causal, heads=2, dim=16)
    mask = AttentionMask(causal=causal)
    x = torch.randn(1, t, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    base = _run(layer, x, mask)[0, query]
    changed = []
    for j in range(t):
        x2 = x.clone()
        x2[0, j] += 1.0
        changed.append(not torch.equal(_run(layer, x2, mask)[0, query], base))
    return torch.tensor(changed)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("causal", MODES)
def test_one_layer_sees_exactly_its_pattern(pattern, causal):
    # A token outside the query's pattern leaves its output bit-for-bit unchanged; every token
    # inside changes it (dense attention or a no-op would fail one of the two).
    t, query = 64, 45
    cfg = SparseConfig(pattern=pattern, stride=8, summary=2, num_verts=1)
    keep = pattern_mask(cfg, t, 2, causal=causal).any(0)[query]  # union over the heads
    got = _one_layer_sensitivity(cfg, causal, t, query)
    assert torch.equal(got, keep)
    assert 0 < keep.sum() < (query + 1 if causal else t) // 2


def test_interleaving_alternates_the_patterns_by_layer():
    model = create_model(
        "sparse-tiny",
        n_layers=4,
        **{"attention.pattern": "strided", "attention.combine": "interleaved"},
    )
    combines = [blk.attn.config.combine for blk in model.blocks]
    assert combines == ["a1", "a2", "a1", "a2"]
    # Layers 0 and 2 share one prepared plan, 1 and 3 the other.
    assert model.blocks._group_of == [0, 1, 0, 1]
    # Layer r sees A^(r mod 2 + 1): position 35 (l = 16) through layer 0 reaches 20..35, through
    # layer 1 only 3, 19, 35.
    t, q = 48, 35
    for r, want in ((0, set(range(20, 36))), (1, {3, 19, 35})):
        cfg = model.config.attention.for_layer(r, 4)
        got = _one_layer_sensitivity(cfg, True, t, q)
        assert set(torch.nonzero(got)[:, 0].tolist()) == want


# ------------------------------------------------------------------------------ plumbing


def test_structural_plan_is_built_once_per_shape():
    cfg = SparseConfig(pattern="fixed", stride=8, summary=2)
    a = build_plan(cfg, 2, 64, causal=True)
    b = build_plan(cfg, 2, 64, causal=True)
    assert a.calls is b.calls  # cached, not rebuilt
    assert build_plan(cfg, 2, 72, causal=True).calls is not a.calls


def test_recomputation_gives_the_same_loss_and_gradients():
    def run(recompute):
        torch.manual_seed(0)
        m = create_model("sparse-tiny", dropout=0.2, recompute=recompute).train()
        ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(0))
        torch.manual_seed(1)
        out = m(ids, targets=ids)
        out.loss.backward()
        return out.loss.detach(), [p.grad for p in m.parameters()]

    (l0, g0), (l1, g1) = run(False), run(True)
    assert_close(l0, l1, rtol=0, atol=0)
    for a, b in zip(g0, g1):
        assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bad_configs_and_inputs_fail_clearly():
    with pytest.raises(ConfigError, match="attention.pattern"):
        SparseConfig(pattern="diagonal")
    with pytest.raises(ConfigError, match="attention.stride"):
        SparseConfig(stride=0)
    with pytest.raises(ConfigError, match="summary"):
        SparseConfig(stride=16, summary=8, num_verts=3)
    with pytest.raises(ConfigError, match="attn_dropout"):
        create_model("sparse-tiny", attn_dropout=0.1)
    dims = AttentionDims(16, 1, 16, causal=True)
    with pytest.raises(ConfigError, match="split"):
        SparseAttention.from_config(SparseConfig(combine="split"), dims)
    layer = _layer(SparseConfig(stride=8, summary=2), causal=True, dtype=torch.float32)
    x = torch.randn(1, 16, 32)
    with pytest.raises(ValueError, match="self-attention"):
        layer(x, kv=x, mask=AttentionMask(causal=True))
    ctx = PrepareContext(
        tq=8, tk=16, mask=AttentionMask(causal=True), device=x.device, dtype=x.dtype
    )
    with pytest.raises(ValueError, match="Tq == Tk"):
        layer.prepare(ctx, None)
