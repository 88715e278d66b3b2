"""Transformer-XL relative attention: the shift trick, the mask, the biases, the dense limit."""

import pytest
import torch
from torch.testing import assert_close

import effiformer.attention.relative_xl as rx
from effiformer.attention import AttentionMask, DenseAttention
from effiformer.attention.relative_xl import (
    RelativePositions,
    RelativeXLAttention,
    rel_shift,
    relative_keep_mask,
)
from effiformer.layers import sinusoid_table


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny ops: one intra-op thread is ~100x faster than two on a loaded shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


D, H, DH = 16, 2, 8


def _r(tk: int) -> torch.Tensor:
    return sinusoid_table(torch.arange(tk - 1, -1, -1), D).double()  # (Tk, D), distances Tk-1..0


def _module(own_biases: bool = True) -> RelativeXLAttention:
    torch.manual_seed(0)
    m = RelativeXLAttention(D, H, DH, own_biases=own_biases).double()
    return m


def _naive(m: RelativeXLAttention, x, kv, r, u, v, max_distance=None):
    """Per-(query, key) gather of R_{i-j}: the definition, no shift trick. (B,Tq,D) -> (B,Tq,D)."""
    b, tq, _ = x.shape
    tk = kv.shape[1]
    mlen = tk - tq
    q = m.q_proj(x).view(b, tq, H, DH)
    k = m.k_proj(kv).view(b, tk, H, DH)
    val = m.v_proj(kv).view(b, tk, H, DH)
    rk = m.r_proj(r).view(tk, H, DH)  # row n encodes distance tk-1-n
    scores = torch.full((b, H, tq, tk), float("-inf"), dtype=x.dtype)
    for i in range(tq):
        for j in range(tk):
            dist = i + mlen - j
            if dist < 0 or (max_distance is not None and dist > max_distance):
                continue
            ac = ((q[:, i] + u) * k[:, j]).sum(-1)  # (B, H)
            bd = ((q[:, i] + v) * rk[tk - 1 - dist]).sum(-1)  # (B, H)
            scores[:, :, i, j] = (ac + bd) / DH**0.5
    p = torch.softmax(scores, -1)
    o = torch.einsum("bhij,bjhd->bihd", p, val).reshape(b, tq, H * DH)
    return m.o_proj(o), p


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (4, 0), (5, 3), (3, 7), (6, 6), (1, 9)])
def test_shift_trick_equals_naive_gather(qlen, mlen):
    tk = qlen + mlen
    g = torch.Generator().manual_seed(qlen * 10 + mlen)
    bd = torch.randn(2, 3, qlen, tk, generator=g, dtype=torch.float64)  # over R rows
    shifted = rel_shift(bd)
    naive = torch.zeros_like(bd)
    for i in range(qlen):
        for j in range(i + mlen + 1):
            naive[..., i, j] = bd[..., i, tk - 1 - (i + mlen - j)]  # row of distance i+mlen-j
    keep = relative_keep_mask(qlen, tk)[0, 0]
    assert_close(shifted.masked_fill(~keep, 0.0), naive, rtol=0, atol=0)


@pytest.mark.parametrize("qlen,mlen", [(4, 0), (5, 3), (3, 7)])
@pytest.mark.parametrize("own_biases", [True, False])
def test_attention_equals_naive_definition(qlen, mlen, own_biases):
    m = _module(own_biases)
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(2, qlen + mlen, D, generator=g, dtype=torch.float64)
    x = kv[:, mlen:]
    r = _r(qlen + mlen)
    if own_biases:
        u, v = m.u_bias, m.v_bias
        pos = RelativePositions(r=r)
    else:
        u = torch.randn(H, DH, generator=g, dtype=torch.float64)
        v = torch.randn(H, DH, generator=g, dtype=torch.float64)
        pos = RelativePositions(r=r, u=u, v=v)
    out = m(x, kv=kv, mask=AttentionMask(causal=True), positions=pos).out
    ref, ref_p = _naive(m, x, kv, r, u, v)
    assert_close(out, ref)
    probs = m.attention_probs(x, kv=kv, mask=AttentionMask(causal=True), positions=pos)
    assert_close(probs, ref_p)


def test_same_length_and_gradients_match_naive():
    m = _module()
    g = torch.Generator().manual_seed(2)
    kv = torch.randn(2, 9, D, generator=g, dtype=torch.float64, requires_grad=True)
    x = kv[:, 5:]
    r = _r(9)
    pos = RelativePositions(r=r, max_distance=5)
    out = m(x, kv=kv, mask=AttentionMask(causal=True), positions=pos).out
    ref, _ = _naive(m, x, kv, r, m.u_bias, m.v_bias, max_distance=5)
    assert_close(out, ref)
    ga = torch.autograd.grad(out.square().sum(), [kv, m.r_proj.weight, m.v_bias])
    gb = torch.autograd.grad(ref.square().sum(), [kv, m.r_proj.weight, m.v_bias])
    for a, b in zip(ga, gb):
        assert_close(a, b)


def test_same_length_rows_see_equal_numbers_of_keys():
    mlen, qlen = 6, 5
    keep = relative_keep_mask(qlen, mlen + qlen, max_distance=mlen)[0, 0]
    assert keep.sum(-1).tolist() == [mlen + 1] * qlen
    plain = relative_keep_mask(qlen, mlen + qlen)[0, 0]
    assert plain.sum(-1).tolist() == [mlen + 1 + i for i in range(qlen)]
    # every kept key is within the window and causal
    dist = torch.arange(qlen)[:, None] + mlen - torch.arange(mlen + qlen)[None]
    assert torch.equal(keep, (dist >= 0) & (dist <= mlen))


def test_zero_positional_term_equals_dense_attention_and_differs_otherwise():
    """Degenerate limit: no positional projection, no biases -> dense causal attention with the
    queries aligned to the last keys. Away from it (W_R != 0) the output differs."""
    m = _module()
    dense = DenseAttention(D, H, DH, bias=False).double()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        getattr(dense, name).load_state_dict(getattr(m, name).state_dict())
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 7, D, generator=g, dtype=torch.float64)
    x = kv[:, 3:]
    mask = AttentionMask(causal=True)
    pos = RelativePositions(r=_r(7))
    want = dense(x, kv=kv, mask=mask).out
    out = m(x, kv=kv, mask=mask, positions=pos).out
    assert not torch.allclose(out, want, atol=1e-3)
    with torch.no_grad():
        m.r_proj.weight.zero_()
        m.u_bias.zero_()
        m.v_bias.zero_()
    assert_close(m(x, kv=kv, mask=mask, positions=pos).out, want)


def test_content_attention_stops_gradients_to_weights():
    m = _module()
    h = torch.randn(2, 4, D, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(2, 6, D, dtype=torch.float64, requires_grad=True)
    out = m.content_attention(h, mem)
    assert out.shape == (2, 4, H * DH)
    out.sum().backward()
    assert all(p.grad is None for p in m.parameters())
    assert h.grad is not None and mem.grad is not None
    out2 = m.content_attention(h, mem, detach_weights=False)
    out2.sum().backward()
    assert m.q_proj.weight.grad is not None and m.k_proj.weight.grad is not None


def test_bad_inputs_name_the_argument():
    m = _module()
    x = torch.randn(1, 3, D, dtype=torch.float64)
    pos = RelativePositions(r=_r(3))
    with pytest.raises(ValueError, match="causal"):
        m(x, mask=AttentionMask(causal=False), positions=pos)
    with pytest.raises(ValueError, match="stateless"):
        m(x, mask=AttentionMask(causal=True), positions=pos, state=torch.zeros(1))
    with pytest.raises(ValueError, match="positions.r"):
        m(x, mask=AttentionMask(causal=True), positions=RelativePositions(r=_r(4)))
    with pytest.raises(TypeError, match="RelativePositions"):
        m(x, mask=AttentionMask(causal=True), positions=_r(3))
    with pytest.raises(ValueError, match="u/v"):
        m(x, mask=AttentionMask(causal=True), positions=RelativePositions(r=_r(3), u=m.u_bias))
    shared = _module(own_biases=False)
    with pytest.raises(ValueError, match="positions.u"):
        shared(x, mask=AttentionMask(causal=True), positions=pos)


@pytest.mark.parametrize("init", ["lecun", "gpt2"])
def test_r_init_std_ablation_starts_the_position_terms_at_zero_and_they_train(init):
    """``r_init_std=0`` (the quality suite's ``relative-xl-r0`` ablation): W_{k,R} is zero after
    the model's own weight init (either init), so the model's output at init does not depend on
    the relative distances (it equals the same weights with the sinusoids zeroed); W_{k,R} still
    gets gradients; the default (None) leaves W_{k,R} to the model's init."""
    from effiformer import get_config
    from effiformer.config import ConfigError
    from effiformer.registry import build_model

    def model(**att):
        torch.manual_seed(0)
        cfg = get_config("vanilla-tiny", vocab_size=16, seq_len=12, dim=16, n_heads=2, ffn_dim=32,
                         init=init, attention={"name": "relative_xl", **att})  # fmt: skip
        return build_model(cfg).double()

    def r_weights(m):
        return [p for n, p in m.named_parameters() if n.endswith("r_proj.weight")]

    zero, base = model(r_init_std=0.0), model()
    assert len(r_weights(zero)) == 2 and all(float(w.abs().max()) == 0 for w in r_weights(zero))
    assert all(float(w.abs().max()) > 0 for w in r_weights(base))
    half = model(r_init_std=0.5)
    assert all(0.3 < float(w.std()) < 0.7 for w in r_weights(half))  # N(0, 0.5), kept
    x = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(1))
    out, base_out = zero(x).logits, base(x).logits
    real = rx.sinusoid_table
    try:  # every distance's encoding scrambled: the zero-started model does not change at init
        rx.sinusoid_table = lambda d, dim: torch.randn(d.shape[0], dim)
        assert_close(zero(x).logits, out)
        assert float((base(x).logits - base_out).abs().max()) > 1e-6  # the default does
    finally:
        rx.sinusoid_table = real
    zero(x, targets=x).loss.backward()
    assert all(float(w.grad.abs().max()) > 0 for w in r_weights(zero))
    for bad in (-0.1, True):
        with pytest.raises(ConfigError, match="r_init_std"):
            model(r_init_std=bad)
