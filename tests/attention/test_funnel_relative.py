"""Funnel relative attention: relative shift = naive gather = factorized, the fused forward equals
the textbook scores (values and gradients), cls-mask, token types, degenerate limit = dense."""

import pytest
import torch
from torch.testing import assert_close

from effiformer.attention import AttentionMask, DenseAttention
from effiformer.attention.funnel_relative import (
    FunnelPositions,
    FunnelRelativeAttention,
    rel_sinusoid,
    relative_distances,
)
from effiformer.layers.pooling import pool_positions
from effiformer.ops.funnel_core import _Buffers, _keep_mask, funnel_attention_core

D, H, DH = 16, 2, 8
F64 = torch.float64


def _attn(seed=0):
    torch.manual_seed(seed)
    return FunnelRelativeAttention(D, H, DH).to(F64)


def _positions(kind, shift, tq_types=None, tk_types=None, cls_first=True, t=9):
    k_pos = torch.arange(t)
    q_pos = k_pos if shift == 1 else pool_positions(k_pos, 1)
    if kind == "relative_shift":
        rel = rel_sinusoid(relative_distances(q_pos, k_pos, shift), D)
        p = FunnelPositions(
            kind, rel=rel, shift=shift, q_types=tq_types, k_types=tk_types, cls_first=cls_first
        )
    else:
        sq, cq = rel_sinusoid(q_pos, D).chunk(2, -1)
        sk, ck = rel_sinusoid(k_pos, D).chunk(2, -1)
        p = FunnelPositions(
            kind,
            enc=(sq, cq, sk, ck),
            shift=shift,
            q_types=tq_types,
            k_types=tk_types,
            cls_first=cls_first,
        )
    return p, q_pos, k_pos


@pytest.mark.parametrize("shift", [1, 2])
def test_relative_shift_equals_naive_gather_and_factorized(shift):
    att = _attn()
    x = torch.randn(2, 9, D, dtype=F64)
    _, q_pos, k_pos = _positions("relative_shift", shift)
    xq = x[:, : len(q_pos)] if shift == 2 else x
    q = att._heads(att.q_proj(xq)) * att.scale
    # naive: (q + v) . W_r R(pos_i - pos_j) for every pair, gathered one by one
    qv = q + att.r_r_bias[:, None, :] * att.scale
    naive = torch.empty(2, H, len(q_pos), len(k_pos), dtype=F64)
    for i, pi in enumerate(q_pos.tolist()):
        for j, pj in enumerate(k_pos.tolist()):
            r = rel_sinusoid(torch.tensor([pi - pj]), D)[0]  # (D,)
            wr = torch.einsum("d,dnh->nh", r, att.r_kernel)  # (H, Dh)
            naive[:, :, i, j] = (qv[:, :, i] * wr[None]).sum(-1)
    # the relative-shift and factorized forms, through the textbook scores with the other
    # terms switched off (zero u, token-type parameters) and no cls-mask
    with torch.no_grad():
        att.r_w_bias.zero_()
        att.r_s_bias.zero_()
        att.seg_embed.zero_()
    content = q @ att._heads(att.k_proj(x)).transpose(-1, -2)
    for kind in ("relative_shift", "factorized"):
        p, _, _ = _positions(kind, shift, cls_first=False)
        s = att.scores(xq, kv=x if shift == 2 else None, positions=p)
        assert_close(s - content, naive, rtol=1e-10, atol=1e-10)


def test_distance_table_entries():
    q_pos, k_pos = torch.tensor([-1, 1, 3, 5]), torch.arange(8)
    table = relative_distances(q_pos, k_pos, 2)
    assert table.numel() == 8 + 2 * 4
    for i in range(4):
        for j in range(8):
            assert table[2 * (4 - i) + j] == q_pos[i] - k_pos[j]


@pytest.mark.parametrize("kind", ["relative_shift", "factorized"])
@pytest.mark.parametrize("shift", [1, 2])
def test_fused_forward_equals_textbook_scores_values_and_gradients(kind, shift):
    att = _attn(1)
    b, t = 2, 9
    p0, q_pos, _ = _positions(kind, shift)
    tq = len(q_pos)
    g = torch.Generator().manual_seed(0)
    qt = torch.randint(0, 2, (b, tq), generator=g)
    kt = torch.randint(0, 2, (b, t), generator=g)
    qt[:, 0], kt[:, 0] = 2, 2
    kt[1, 4] = 2  # a [CLS]-typed token in the middle counts as the same segment as everyone
    p, _, _ = _positions(kind, shift, qt, kt)
    x = torch.randn(b, tq, D, dtype=F64, requires_grad=True)
    kv = torch.randn(b, t, D, dtype=F64, requires_grad=True)
    keep = torch.ones(b, t, dtype=torch.bool)
    keep[0, -3:] = False
    mask = AttentionMask(key_padding=keep)
    out = att(x, kv=kv, mask=mask, positions=p).out
    s = att.scores(x, kv=kv, mask=mask, positions=p)
    _, _, v = att._project(x, kv)
    o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, tq, H * DH)
    ref = att.o_proj(o)
    assert_close(out, ref, rtol=1e-10, atol=1e-10)
    params = [x, kv, *att.parameters()]
    g1 = torch.autograd.grad((out * ref.detach()).sum(), params)
    g2 = torch.autograd.grad((ref * ref.detach()).sum(), params)
    for a, c in zip(g1, g2):
        assert_close(a, c, rtol=1e-9, atol=1e-10)


def test_relative_shift_chunks_agree(monkeypatch):

    att = _attn(2)
    p, _, _ = _positions("relative_shift", 1, t=11)
    x = torch.randn(1, 11, D, dtype=F64, requires_grad=True)
    a = att(x, positions=p).out
    ga = torch.autograd.grad(a.square().sum(), [x, att.r_kernel])
    import effiformer.ops.funnel_core as core

    monkeypatch.setattr(core, "_CHUNK", 4)
    monkeypatch.setattr(core, "_MIN_CHUNK", 4)
    b = att(x, positions=p).out
    gb = torch.autograd.grad(b.square().sum(), [x, att.r_kernel])
    assert_close(a, b, rtol=1e-12, atol=1e-12)
    for u, w in zip(ga, gb):
        assert_close(u, w, rtol=1e-10, atol=1e-12)


def test_cls_mask_zeroes_position_and_token_type_terms_on_row_and_column_zero():
    att = _attn(3)
    tt = torch.tensor([[2, 0, 0, 0, 1, 1, 1, 1, 1]])
    p, _, _ = _positions("relative_shift", 1, tt, tt)
    x = torch.randn(1, 9, D, dtype=F64)
    s = att.scores(x, positions=p)
    q, k, _ = att._project(x, None)
    content = (q + att.r_w_bias[:, None] * att.scale) @ k.transpose(-1, -2)
    # [CLS] logits are the content-only score; every other entry is not
    assert_close(s[..., 0, :], content[..., 0, :])
    assert_close(s[..., :, 0], content[..., :, 0])
    assert (s[..., 1:, 1:] - content[..., 1:, 1:]).abs().min() > 1e-6
    # the output at [CLS] ignores the relative parameters; other rows do not
    out = att(x, positions=p).out
    with torch.no_grad():
        att.r_kernel.mul_(3.0)
        att.seg_embed.add_(0.5)
    out2 = att(x, positions=p).out
    assert_close(out[:, 0], out2[:, 0])
    assert not torch.allclose(out[:, 1:], out2[:, 1:])


def test_token_types_change_scores_only_across_segments():
    att = _attn(4)
    same = torch.zeros(1, 9, dtype=torch.long)
    split = same.clone()
    split[0, 5:] = 1
    x = torch.randn(1, 9, D, dtype=F64)
    a = att.scores(x, positions=_positions("relative_shift", 1, same, same, cls_first=False)[0])
    b = att.scores(x, positions=_positions("relative_shift", 1, split, split, cls_first=False)[0])
    diff = (a - b).abs()[0, 0]
    assert diff[:5, :5].max() < 1e-12 and diff[5:, 5:].max() < 1e-12
    assert diff[:5, 5:].min() > 1e-9 and diff[5:, :5].min() > 1e-9


def test_degenerate_limit_is_dense_attention_and_differs_away_from_it():
    att = _attn(5)
    dense = DenseAttention(D, H, DH).to(F64)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(dense, name).weight.copy_(getattr(att, name).weight)
            if name != "q_proj":
                getattr(dense, name).bias.copy_(getattr(att, name).bias)
        dense.q_proj.bias.zero_()
    x = torch.randn(2, 9, D, dtype=F64)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    mask = AttentionMask(key_padding=keep)
    p, _, _ = _positions(
        "relative_shift",
        1,
        torch.zeros(2, 9, dtype=torch.long),
        torch.zeros(2, 9, dtype=torch.long),
    )
    away = att(x, mask=mask, positions=p).out
    assert not torch.allclose(away, dense(x, mask=mask).out, atol=1e-4)
    with torch.no_grad():
        for prm in (att.r_w_bias, att.r_r_bias, att.r_s_bias, att.r_kernel, att.seg_embed):
            prm.zero_()
    assert_close(att(x, mask=mask, positions=p).out, dense(x, mask=mask).out)


def test_padding_keys_do_not_change_the_output():
    att = _attn(6)
    p, _, _ = _positions("relative_shift", 1)
    x = torch.randn(1, 9, D, dtype=F64)
    keep = torch.ones(1, 9, dtype=torch.bool)
    keep[0, 7:] = False
    y = x.clone()
    y[0, 7:] = torch.randn(2, D, dtype=F64)
    m = AttentionMask(key_padding=keep)
    assert_close(att(x, mask=m, positions=p).out[:, :7], att(y, mask=m, positions=p).out[:, :7])


def _core_inputs(seed, b, h, tq, tk, dh, nf, shift):
    """Random float64 inputs of the core: qu, k, v, qf, kf, c0 (requiring grad), the padding
    bias kb (no gradient), r and pb (requiring grad)."""
    torch.manual_seed(seed)
    shapes = [(b, h, tq, dh), (b, h, tk, dh), (b, h, tk, dh), (b, h, tq, nf), (b, h, tk, nf)]
    shapes += [(b, h, tq), (b, 1, 1, tk), (h, tk + shift * tq, dh), (h, dh)]
    out = [torch.randn(*s, dtype=F64) for s in shapes]
    for i, t in enumerate(out):
        t.requires_grad_(i != 6)
    return out


def test_core_gradcheck_with_dropout_mask():
    b, h, tq, tk, dh, nf, shift = 1, 2, 3, 5, 3, 2, 1
    qu, k, v, qf, kf, c0, kb, r, pb = _core_inputs(0, b, h, tq, tk, dh, nf, shift)
    # dropout masks are re-drawn from the same seed in the backward pass; row 0 of the position
    # query is zeroed (the cls-mask) or not
    for row0 in (True, False):
        assert torch.autograd.gradcheck(
            lambda qu, k, v, qf, kf, c0, r, pb, row0=row0: funnel_attention_core(
                qu, k, v, qf, kf, c0, kb, r, pb, row0, shift, 0.3, 1234
            ),
            (qu, k, v, qf, kf, c0, r, pb),
        )
    none4 = (None, None, None, None, None, None)
    assert torch.autograd.gradcheck(
        lambda *a: funnel_attention_core(*a, *none4, False, shift, 0.0, 0), (qu, k, v)
    )
    # strided views (the heads of a projection) are accepted as they are
    kv = torch.randn(b, tk, h, dh, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, kv_: funnel_attention_core(
            a, kv_.transpose(1, 2), kv_.transpose(1, 2) * 2, *none4, False, 1, 0.0, 0
        ),
        (qu, kv),
    )


def test_dropout_mask_keeps_one_minus_p_and_the_core_applies_it():
    """The packed-bits keep mask: P(keep) = 1 - p (4M draws: within 5 standard errors), the same
    seed gives the same mask, and the core's output is exactly softmax * mask / (1 - p) @ v with
    the mask the core draws for its one chunk."""
    for p in (0.1, 0.5):
        keep = _keep_mask(torch.Generator().manual_seed(7), (4, 1000, 1000), p, _Buffers("cpu"))
        assert keep.dtype == torch.bool and keep.shape == (4, 1000, 1000)
        frac = keep.double().mean().item()
        assert abs(frac - (1 - p)) < 5 * (p * (1 - p) / 4e6) ** 0.5, (p, frac)
    m1 = _keep_mask(torch.Generator().manual_seed(3), (2, 5, 7), 0.3, _Buffers("cpu")).clone()
    m2 = _keep_mask(torch.Generator().manual_seed(3), (2, 5, 7), 0.3, _Buffers("cpu"))
    assert torch.equal(m1, m2) and 0 < m1.sum() < m1.numel()
    b, h, tq, tk, dh = 1, 2, 5, 7, 3
    torch.manual_seed(0)
    qu, k, v = (torch.randn(b, h, n, dh, dtype=F64) for n in (tq, tk, tk))
    none6 = (None,) * 6
    out = funnel_attention_core(qu, k, v, *none6, False, 1, 0.3, 99)
    keep = _keep_mask(torch.Generator().manual_seed(99), (b * h, tq, tk), 0.3, _Buffers("cpu"))
    probs = torch.softmax(qu @ k.transpose(-1, -2), -1) * keep.view(b, h, tq, tk) / 0.7
    assert_close(out, probs @ v, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out, torch.softmax(qu @ k.transpose(-1, -2), -1) @ v)


def test_core_matches_softmax_reference_with_every_term():
    """Every input of the core at once (features, [CLS] column, padding bias, relative shift with
    the zeroed row 0) against the explicit softmax, values and gradients."""
    b, h, tq, tk, dh, nf, shift = 2, 2, 4, 8, 3, 2, 2
    qu, k, v, qf, kf, c0, kb, r, pb = _core_inputs(1, b, h, tq, tk, dh, nf, shift)
    kf = kf.detach()
    kb = torch.zeros(b, 1, 1, tk, dtype=F64)
    kb[1, ..., -2:] = -1e6
    out = funnel_attention_core(qu, k, v, qf, kf, c0, kb, r, pb, True, shift, 0.0, 0)
    qv = qu + pb[None, :, None]
    qv = torch.cat([torch.zeros_like(qv[:, :, :1]), qv[:, :, 1:]], dim=2)
    idx = shift * (tq - torch.arange(tq))[:, None] + torch.arange(tk)[None]  # (Tq, Tk)
    pos = torch.einsum("bhid,hijd->bhij", qv, r[:, idx])
    s = qu @ k.transpose(-1, -2) + qf @ kf.transpose(-1, -2) + pos + kb
    s = s + torch.nn.functional.pad(c0[..., None], (0, tk - 1))
    ref = torch.softmax(s, -1) @ v
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    params = (qu, k, v, qf, c0, r, pb)
    g1 = torch.autograd.grad((out * ref.detach()).sum(), params)
    g2 = torch.autograd.grad((ref * ref.detach()).sum(), params)
    for a, c in zip(g1, g2):
        assert_close(a, c, rtol=1e-10, atol=1e-11)


def test_bad_inputs_get_clear_errors():
    att = _attn()
    x = torch.randn(1, 9, D, dtype=F64)
    with pytest.raises(ValueError, match="FunnelPositions"):
        att(x)
    p, _, _ = _positions("relative_shift", 1)
    with pytest.raises(ValueError, match="bidirectional"):
        att(x, mask=AttentionMask(causal=True), positions=p)
    with pytest.raises(ValueError, match="positions.rel"):
        att(x[:, :5], positions=p)


def _stored_bytes(module, fn):
    """Bytes of the distinct non-parameter storages autograd keeps for the backward pass."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_stores_no_more_than_a_dense_sdpa_layer_besides_the_distance_table():
    """The fused core keeps one query and the heads' views (no copies), like a dense layer on
    scaled_dot_product_attention; what it stores beyond that is batch-independent (the distance
    table and its projection). Checked at batch 1 and 8: the excess must not grow with B."""
    d, t = 64, 64
    torch.manual_seed(0)
    fun = FunnelRelativeAttention(d, 4, 16)
    dense = DenseAttention(d, 4, 16)
    k_pos = torch.arange(t)
    rel = rel_sinusoid(relative_distances(k_pos, k_pos, 1), d).float()
    pos = FunnelPositions("relative_shift", rel=rel, shift=1)
    excess = []
    for b in (1, 8):
        x = torch.randn(b, t, d, requires_grad=True)
        f = _stored_bytes(fun, lambda x=x: fun(x, positions=pos).out)
        g = _stored_bytes(dense, lambda x=x: dense(x).out)
        excess.append(f - g)
        assert f - g <= rel.nbytes + 2 * 4 * (2 * t) * 16 * 4, (b, f, g)
    assert excess[1] <= excess[0] + 8 * 4 * t * 4 * 4  # at most a few (B, H, T) vectors more
