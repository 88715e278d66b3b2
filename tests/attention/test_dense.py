"""Dense attention equals a plain matmul-softmax reference (float64, full tensors)."""

import pytest
import torch
from torch.testing import assert_close

from effiformer.attention import AttentionMask, DenseAttention, dense_bool_mask
from effiformer.attention.dense import reference_attention


def _layer(dim=16, heads=2, head_dim=8, seed=0):
    torch.manual_seed(seed)
    return DenseAttention(dim, heads, head_dim).double().eval()


def _reference(layer, x, kv, keep):
    def heads(t):
        b, n, _ = t.shape
        return t.view(b, n, layer.n_heads, layer.head_dim).transpose(1, 2)

    src = x if kv is None else kv
    q, k, v = heads(layer.q_proj(x)), heads(layer.k_proj(src)), heads(layer.v_proj(src))
    o = reference_attention(q, k, v, keep)
    return layer.o_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


def _naive_keep(tq, tk, causal, key_padding):
    keep = torch.ones(1, 1, tq, tk, dtype=torch.bool)
    if causal:
        for i in range(tq):
            for j in range(tk):
                keep[0, 0, i, j] = j <= i + (tk - tq)
    if key_padding is not None:
        keep = keep & key_padding[:, None, None, :]
    return keep


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("tq,tk", [(7, 7), (3, 7)])
def test_dense_matches_reference(causal, padded, tq, tk):
    layer = _layer()
    x = torch.randn(2, tq, 16, dtype=torch.float64)
    kv = None if tq == tk else torch.randn(2, tk, 16, dtype=torch.float64)
    kp = None
    if padded:
        kp = torch.ones(2, tk, dtype=torch.bool)
        kp[1, -2:] = False  # last two keys of row 1 are padding
        if causal:
            kp[1, -2:] = True
            kp[1, 1] = False  # a padded key inside the window; row 0 still sees key 0
    mask = AttentionMask(causal=causal, key_padding=kp)
    out = layer(x, kv=kv, mask=mask).out
    keep = _naive_keep(tq, tk, causal, kp)
    expected = _reference(layer, x, kv, keep if (causal or padded) else None)
    assert_close(out, expected)


def test_mask_changes_output():
    layer = _layer()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    full = layer(x).out
    causal = layer(x, mask=AttentionMask(causal=True)).out
    # The last query sees every key either way; earlier ones must differ.
    assert_close(full[:, -1], causal[:, -1])
    assert not torch.allclose(full[:, :-1], causal[:, :-1])


def test_causal_future_keys_do_not_matter():
    layer = _layer()
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 16, dtype=torch.float64)
    a = layer(x, mask=AttentionMask(causal=True)).out
    b = layer(y, mask=AttentionMask(causal=True)).out
    assert_close(a[:, :5], b[:, :5])


def test_bottom_right_causal_alignment():
    keep = dense_bool_mask(2, 5, causal=True)
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(keep[0, 0], expected)


def test_bad_shapes_are_named():
    layer = _layer()
    with pytest.raises(ValueError, match="x must be"):
        layer(torch.randn(2, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="kv must be"):
        layer(
            torch.randn(2, 5, 16, dtype=torch.float64),
            kv=torch.randn(3, 5, 16, dtype=torch.float64),
        )
    with pytest.raises(ValueError, match="key_padding"):
        layer(
            torch.randn(2, 5, 16, dtype=torch.float64),
            mask=AttentionMask(key_padding=torch.ones(2, 4, dtype=torch.bool)),
        )
    with pytest.raises(ValueError, match="Tk >= Tq"):
        layer(
            torch.randn(1, 5, 16, dtype=torch.float64),
            kv=torch.randn(1, 3, 16, dtype=torch.float64),
            mask=AttentionMask(causal=True),
        )


def test_kv_cache_decoding_equals_the_full_causal_forward():
    from effiformer.attention import AttentionMask, DenseAttention
    from effiformer.attention.base import KVCache

    torch.manual_seed(0)
    m = DenseAttention(16, 2, 8).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    full = m(x, mask=AttentionMask(causal=True)).out
    cache = KVCache.empty(2, 2, 8, dtype=torch.float64)
    outs = []
    for t in range(7):  # one token at a time, then a two-token step
        o = m(x[:, t : t + 1], mask=AttentionMask(causal=True), state=cache)
        cache = o.state
        outs.append(o.out)
    assert cache.length == 7
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-12, atol=1e-12)
    o = m(
        x[:, 5:],
        mask=AttentionMask(causal=True),
        state=KVCache(cache.k[:, :, :5], cache.v[:, :, :5]),
    )
    torch.testing.assert_close(o.out, full[:, 5:], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="key_padding must be"):
        m(
            x[:, :1],
            mask=AttentionMask(causal=True, key_padding=torch.ones(2, 1, dtype=torch.bool)),
            state=cache,
        )
