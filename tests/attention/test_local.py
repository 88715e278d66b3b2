"""Local (chunked) attention equals dense attention under the chunk-neighbourhood mask (full
tensors, float64), for causal and bidirectional models, with padding, and never reaches beyond
its chunks."""

import pytest
import torch
from torch.testing import assert_close

from effiformer.attention import AttentionDims, AttentionMask, PrepareContext
from effiformer.attention.base import reference_attention
from effiformer.attention.local import LocalAttention, LocalConfig

D, H = 16, 2


def _layer(window, causal, look_backward=1, look_forward=None):
    torch.manual_seed(0)
    cfg = LocalConfig(window=window, look_backward=look_backward, look_forward=look_forward)
    dims = AttentionDims(D, H, D // H, causal=causal)
    return LocalAttention.from_config(cfg, dims).double().eval()


def _run(m, x, mask):
    ctx = PrepareContext(tq=x.shape[1], tk=x.shape[1], mask=mask, device=x.device, dtype=x.dtype)
    return m(x, mask=mask, positions=m.prepare(ctx, None)).out


def _reference(m, x, mask, window, back, fwd):
    t = x.shape[1]
    chunk = torch.arange(t) // window
    d = chunk[None, :] - chunk[:, None]  # key chunk - query chunk
    keep = (d >= -back) & (d <= fwd)
    if mask.causal:
        keep = keep & (torch.arange(t)[None, :] <= torch.arange(t)[:, None])
    keep = keep[None, None]
    if mask.key_padding is not None:
        keep = keep & mask.key_padding[:, None, None, :]
    b = x.shape[0]

    def heads(p):
        return p(x).view(b, t, H, D // H).transpose(1, 2)

    o = reference_attention(heads(m.q_proj), heads(m.k_proj), heads(m.v_proj), keep)
    return m.o_proj(o.transpose(1, 2).reshape(b, t, D))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t,window", [(24, 8), (27, 8), (5, 8)])
def test_equals_dense_under_the_chunk_mask(causal, t, window):
    m = _layer(window, causal)
    fwd = 0 if causal else 1
    x = torch.randn(2, t, D, dtype=torch.float64)
    real = torch.ones(2, t, dtype=torch.bool)
    real[1, -3:] = False
    for kp in (None, real):
        mask = AttentionMask(causal=causal, key_padding=kp)
        out = _run(m, x, mask)
        want = _reference(m, x, mask, min(window, t), 1, fwd)
        rows = torch.ones_like(real) if kp is None else real
        assert_close(out[rows], want[rows], rtol=1e-10, atol=1e-10)


def test_a_token_beyond_the_previous_chunk_does_not_reach_a_query():
    m = _layer(4, causal=True)
    x = torch.randn(1, 16, D, dtype=torch.float64)
    base = _run(m, x, AttentionMask(causal=True))
    x2 = x.clone()
    x2[:, 1] += 1.0  # chunk 0: reaches chunks 0 and 1 only
    out = _run(m, x2, AttentionMask(causal=True))
    assert_close(out[:, 8:], base[:, 8:], rtol=0, atol=0)
    assert not torch.allclose(out[:, 4:8], base[:, 4:8])


def test_padded_neighbourhoods_give_finite_gradients():
    m = _layer(4, causal=False).train()
    x = torch.randn(2, 16, D, dtype=torch.float64, requires_grad=True)
    real = torch.ones(2, 16, dtype=torch.bool)
    real[1, 4:] = False  # chunks 2 and 3 of row 1 see only padding
    out = _run(m, x, AttentionMask(key_padding=real))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_invalid_config_is_named():
    from effiformer import ConfigError

    with pytest.raises(ConfigError, match="attention.window"):
        LocalConfig(window=0)
    with pytest.raises(ConfigError, match="attention.look_backward"):
        LocalConfig(look_backward=-1)


# ------------------------------------------------------------------ strided path (CPU kernel)


def _strided_inputs(b, t, h, dh, seed):
    """q, k, v as (B, T, H, Dh) views of one wider (B, T, 3 H Dh + 3) tensor (the layout of a
    fused projection: rows are 3 H Dh + 3 apart), requiring grad through it."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(b, t, 3 * h * dh + 3, generator=g, dtype=torch.float64)
    wide.requires_grad_()
    q, k, v = (wide[..., i * h * dh : (i + 1) * h * dh].view(b, t, h, dh) for i in range(3))
    return wide, q, k, v


def _dense_local(q, k, v, window, back, fwd, causal, scale=None):
    """Full (T, T) softmax attention under the chunk-neighbourhood mask, (B, T, H, Dh)."""
    t, dh = q.shape[1], q.shape[3]
    chunk = torch.arange(t) // window
    d = chunk[None, :] - chunk[:, None]  # key chunk - query chunk
    keep = (d >= -back) & (d <= fwd)
    if causal:
        keep = keep & (torch.arange(t)[None, :] <= torch.arange(t)[:, None])
    s = torch.einsum("bihd,bjhd->bhij", q, k) * (dh**-0.5 if scale is None else scale)
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)  # (B, H, T, T)
    return torch.einsum("bhij,bjhd->bihd", p, v)


@pytest.mark.parametrize(
    "causal,t,window,back,fwd",
    [
        (True, 200, 8, 1, 0),  # 25 chunks: full chunks in several groups, the first one alone
        (True, 203, 8, 1, 0),  # a partial last chunk
        (True, 90, 8, 2, 1),  # two chunks back; a later chunk is masked by causality
        (False, 203, 8, 1, 1),  # bidirectional: the last chunks have missing or short neighbours
        (False, 100, 16, 0, 2),
        (True, 5, 8, 1, 0),  # one chunk shorter than the window
    ],
)
def test_strided_path_equals_dense_attention_and_the_gathered_path(causal, t, window, back, fwd):
    from effiformer.attention.local import local_attention, make_plan

    plan = make_plan(t, window, back, fwd, causal=causal)
    grad = torch.randn(2, t, 2, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = []
    for path in ("dense", False, True):
        wide, q, k, v = _strided_inputs(2, t, 2, 4, seed=0)
        if path == "dense":
            o = _dense_local(q, k, v, min(window, t), back, fwd, causal, scale=0.3)
        else:
            o = local_attention(q, k, v, plan, scale=0.3, strided=path)
        (g,) = torch.autograd.grad(o, wide, grad)
        results.append((o, g))
    (o_ref, g_ref), gathered, strided = results
    for o, g in (gathered, strided):
        assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
        assert_close(g, g_ref, rtol=1e-12, atol=1e-12)  # dq, dk, dv through the views


def test_strided_path_passes_gradcheck():
    from effiformer.attention.local import local_attention, make_plan

    plan = make_plan(21, 4, 1, 0, causal=True)  # 6 chunks, the last one partial
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(1, 21, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: local_attention(q, k, v, plan, strided=True), (q, k, v)
    )


def test_strided_path_says_why_it_cannot_take_a_call():
    from effiformer.attention.local import local_attention, make_plan

    plan = make_plan(16, 4, 1, 0, causal=True)
    q = torch.randn(1, 16, 2, 4, dtype=torch.float64)
    real = torch.ones(1, 16, dtype=torch.bool)
    with pytest.raises(ValueError, match="key padding"):
        local_attention(q, q, q, plan, key_padding=real, strided=True)
    with pytest.raises(ValueError, match="dropout"):
        local_attention(q, q, q, plan, dropout_p=0.1, strided=True)
    with pytest.raises(ValueError, match="float32 or float64"):
        local_attention(q.half(), q.half(), q.half(), plan, strided=True)


def test_strided_path_keeps_no_neighbour_tiles_for_the_backward():
    # What the autograd graph keeps: the caller's q, k, v (views: no new storage), the output
    # (B, T, H, Dh) and the log-sum-exp (B, T, H). The gathered path also keeps the (chunks, 2w)
    # neighbour keys and values: twice the size of k and v each.
    from effiformer.attention.local import local_attention, make_plan

    t, h, dh = 512, 2, 8
    plan = make_plan(t, 32, 1, 0, causal=True)

    def saved_bytes(strided):
        wide, q, k, v = _strided_inputs(1, t, h, dh, seed=0)
        storages = {}

        def pack(x):
            st = x.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            local_attention(q, k, v, plan, strided=strided)
        return sum(storages.values()) - wide.untyped_storage().nbytes()

    out_bytes = t * h * dh * 8  # float64
    assert saved_bytes(True) <= out_bytes + t * h * 8  # output + log-sum-exp
    assert saved_bytes(False) >= 4 * out_bytes  # the 2w-wide keys and values


def test_the_regular_chunks_are_found_from_the_integers_as_from_the_masks():
    """``make_plan`` finds the chunks that share one mask from the integers alone (no tensor read,
    so one graph under torch.compile); the tensor form it replaced is the oracle."""
    from effiformer.attention.local import _regular_from, make_plan

    def from_masks(plan, back):
        if plan.n_chunks <= back:
            return None
        seen = plan.valid[back:] ^ plan.valid[back]
        if plan.rel is not None:
            seen = seen & plan.rel.any(0)
        return None if bool(seen.any()) else back

    checked = 0
    for t in (1, 5, 8, 12, 16, 17, 31, 32, 40):
        for w in (1, 3, 4, 8):
            for back in (0, 1, 2):
                for fwd in (0, 1, 2):
                    for causal in (True, False):
                        plan = make_plan(t, w, back, fwd, causal=causal)
                        want = from_masks(plan, back)
                        assert plan.regular_from == want, (t, w, back, fwd, causal)
                        assert _regular_from(t, plan.window, back, fwd, causal) == want
                        checked += want is not None
    assert checked > 100  # both answers occur
