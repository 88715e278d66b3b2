"""Lite Transformer's LSRA (attention on the first channels, convolution on the rest) and the
lightweight / dynamic convolutions of its convolution branch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from effiformer.attention import AttentionDims, AttentionMask, DenseAttention
from effiformer.attention.convolution import (
    ConvBranch,
    conv_padding,
    depthwise_conv,
)
from effiformer.attention.lsra import (
    DynamicConvConfig,
    LightConvConfig,
    LSRAAttention,
    LSRAConfig,
    LSRAState,
    branch_widths,
)
from effiformer.config import ConfigError, attention_config

D = 32
B, T = 2, 20


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _layer(*, causal=False, dtype=torch.float64, seed=0, **fields) -> LSRAAttention:
    fields.setdefault("kernel_sizes", (5,))
    config = LSRAConfig(**fields)
    torch.manual_seed(seed)
    dims = AttentionDims(D, 2, D // 2, causal=causal, layer=0, n_layers=1, max_len=64)
    return LSRAAttention.from_config(config, dims).to(dtype).eval()


def _x(t=T, seed=1, dtype=torch.float64, batch=B, dim=D):
    return torch.randn(batch, t, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _naive_conv(x, w, padding_l):
    """out[b, t, c] = sum_k w[.., h(c), k] x[b, t + k - P, c], by loops (the definition)."""
    b, t, c = x.shape
    h, k = w.shape[-2:]
    r = c // h
    out = torch.zeros_like(x)
    for i in range(t):
        for j in range(k):
            s = i + j - padding_l
            if 0 <= s < t:
                ww = w[:, j] if w.dim() == 2 else w[:, i, :, j]  # (H,) or (B, H)
                out[:, i] += ww.repeat_interleave(r, dim=-1) * x[:, s]
    return out


CONVS = [
    dict(conv="lightweight", glu=False),
    dict(conv="dynamic", glu=True),
    dict(conv="dynamic", glu=False),
]


# ---- the convolution forms ----------------------------------------------------------------


@pytest.mark.parametrize("shared", [True, False], ids=["lightweight", "dynamic"])
@pytest.mark.parametrize(
    "t,k,causal",
    [(12, 3, False), (12, 7, True), (5, 31, True), (5, 31, False), (70, 15, False), (9, 4, False)],
)
def test_band_unfold_conv1d_and_loops_agree(shared, t, k, causal):
    g = torch.Generator().manual_seed(t * 100 + k)
    h, c = 2, 8
    x = torch.randn(2, t, c, generator=g, dtype=torch.float64)
    w = torch.randn(*(() if shared else (2, t)), h, k, generator=g, dtype=torch.float64)
    p = conv_padding(k, causal)
    want = _naive_conv(x, w, p)
    methods = ["band", "unfold"] + (["conv1d"] if shared else [])
    for m in methods:
        for block in (4, 32):
            assert_close(depthwise_conv(x, w, padding_l=p, method=m, block=block), want)


def test_band_and_unfold_agree_to_1e6_in_float32_with_gradients():
    g = torch.Generator().manual_seed(0)
    for shared in (True, False):
        for t, k, causal in ((200, 31, True), (200, 31, False), (33, 15, False), (7, 31, True)):
            x = torch.randn(3, t, 16, generator=g).requires_grad_()
            w = torch.softmax(torch.randn(*(() if shared else (3, t)), 4, k, generator=g), -1)
            w.requires_grad_()
            p = conv_padding(k, causal)
            outs, grads = [], []
            for m in ("band", "unfold") + (("conv1d",) if shared else ()):
                y = depthwise_conv(x, w, padding_l=p, method=m)
                gx, gw = torch.autograd.grad((y * y).sum(), (x, w))
                outs.append(y)
                grads.append((gx, gw))
            for y, (gx, gw) in zip(outs[1:], grads[1:]):
                assert_close(y, outs[0], rtol=0, atol=1e-6)
                assert_close(gx, grads[0][0], rtol=1e-5, atol=1e-5)
                assert_close(gw, grads[0][1], rtol=1e-5, atol=1e-5)


def test_band_form_passes_gradcheck():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 9, 2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    f = lambda x_, w_: depthwise_conv(x_, w_, padding_l=4, method="band", block=4)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w))


def test_a_causal_kernel_longer_than_the_sequence_keeps_its_last_taps():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 4, generator=g, dtype=torch.float64)
    w = torch.randn(2, 31, generator=g, dtype=torch.float64)
    for m in ("band", "unfold", "conv1d"):
        got = depthwise_conv(x, w, padding_l=30, method=m)
        assert_close(got, depthwise_conv(x, w[:, -4:], padding_l=3, method=m))


def test_conv_errors_name_the_argument():
    x = torch.zeros(1, 5, 6)
    with pytest.raises(ValueError, match="groups"):
        depthwise_conv(x, torch.zeros(4, 3), padding_l=1)
    with pytest.raises(ValueError, match="padding_l"):
        depthwise_conv(x, torch.zeros(2, 3), padding_l=3)
    with pytest.raises(ValueError, match="conv1d"):
        depthwise_conv(x, torch.zeros(1, 5, 2, 3), padding_l=1, method="conv1d")
    with pytest.raises(ValueError, match="method"):
        depthwise_conv(x, torch.zeros(2, 3), padding_l=1, method="fft")


# ---- the convolution branch ---------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True])
def test_kernel_rows_sum_to_one_and_dropconnect_is_off_in_eval(dynamic):
    torch.manual_seed(0)
    br = ConvBranch(8, kernel_size=5, heads=2, dynamic=dynamic, weight_dropout=0.5).double()
    x = _x(dim=8)
    w = br.kernel(br.conv_input(x))
    assert w.shape == ((2, 5) if not dynamic else (B, T, 2, 5))
    assert_close(w.sum(-1), torch.ones(w.shape[:-1], dtype=w.dtype))
    assert (w > 0).all()
    br.eval()
    ref = ConvBranch(8, kernel_size=5, heads=2, dynamic=dynamic, weight_dropout=0.0).double()
    ref.load_state_dict(br.state_dict())
    ref.eval()
    a, _ = br(x, causal=False)
    assert_close(a, br(x, causal=False)[0], rtol=0, atol=0)
    assert_close(a, ref(x, causal=False)[0], rtol=0, atol=0)
    br.train()  # DropConnect on: random, and not the eval output
    torch.manual_seed(1)
    b1, _ = br(x, causal=False)
    torch.manual_seed(2)
    b2, _ = br(x, causal=False)
    assert not torch.allclose(b1, a) and not torch.allclose(b1, b2)


def test_lightweight_dropconnect_mask_is_shared_by_every_position():
    torch.manual_seed(0)
    br = ConvBranch(4, kernel_size=3, heads=1, weight_dropout=0.5).double().train()
    x = torch.ones(1, 10, 4, dtype=torch.float64)
    # constant input: one (H, K) mask gives the same output at every interior position
    y, _ = br(x, causal=False)
    assert_close(y[0, 1:-1], y[0, 1:2].expand(8, 4), rtol=0, atol=1e-12)


def test_dynamic_conv_with_a_constant_kernel_generator_equals_the_lightweight_conv():
    torch.manual_seed(0)
    c, h, k = 8, 2, 5
    light = ConvBranch(c, kernel_size=k, heads=h, dynamic=False).double().eval()
    dyn = ConvBranch(c, kernel_size=k, heads=h, dynamic=True).double().eval()
    dyn.linear1.load_state_dict(light.linear1.state_dict())
    dyn.linear2.load_state_dict(light.linear2.state_dict())
    bias = torch.randn(h * k, dtype=torch.float64)
    gen = nn.Linear(c, h * k, bias=True).double()
    with torch.no_grad():
        gen.weight.zero_()
        gen.bias.copy_(bias)
        light.weight.copy_(bias.view(h, k))
    dyn.weight_linear = gen  # zero weight, fixed bias: the same kernel at every position
    x = _x(dim=c)
    for causal in (False, True):
        assert_close(dyn(x, causal=causal)[0], light(x, causal=causal)[0])
    # and the built-in bias-free generator with zero weight: the uniform kernel
    with torch.no_grad():
        dyn.weight_linear = nn.Linear(c, h * k, bias=False).double()
        dyn.weight_linear.weight.zero_()
        light.weight.zero_()
    assert_close(dyn(x, causal=False)[0], light(x, causal=False)[0])


def test_dynamic_kernels_come_from_each_positions_post_glu_input():
    torch.manual_seed(0)
    br = ConvBranch(8, kernel_size=3, heads=2, dynamic=True, glu=True).double().eval()
    x = _x(dim=8)
    u = br.conv_input(x)

    w = br.kernel(u)
    want = torch.softmax((u @ br.weight_linear.weight.T).view(B, T, 2, 3), -1)
    assert_close(w, want)
    a, b = torch.nn.functional.linear(x, br.linear1.weight, br.linear1.bias).chunk(2, -1)
    assert_close(u, a * torch.sigmoid(b))
    assert br.weight_linear.bias is None


# ---- the LSRA layer -------------------------------------------------------------------------


def _conv_params(m):
    return [(n, p) for n, p in m.named_parameters() if n.startswith("conv.")]


def _attn_params(m):
    return [(n, p) for n, p in m.named_parameters() if n.startswith("attn.")]


@pytest.mark.parametrize("fields", CONVS, ids=["lightweight", "dynamic-glu", "dynamic"])
@pytest.mark.parametrize("causal", [False, True])
def test_branch_parameters_change_only_their_own_output_channels(fields, causal):
    m = _layer(causal=causal, **fields)
    a = m.attn_dim
    assert a == D // 2
    x = _x()
    mask = AttentionMask(causal=causal)
    base = m(x, mask=mask).out
    for own, other in ((slice(a, D), slice(0, a)), (slice(0, a), slice(a, D))):
        params = _conv_params(m) if own.start == a else _attn_params(m)
        assert params
        for name, p in params:
            with torch.no_grad():
                old = p.clone()
                p.add_(torch.randn_like(p) * 0.5)
            out = m(x, mask=mask).out
            with torch.no_grad():
                p.copy_(old)
            assert_close(out[..., other], base[..., other], rtol=0, atol=0, msg=name)
            if name != "attn.k_proj.bias":  # a bias on every key shifts all scores: no change
                assert not torch.allclose(out[..., own], base[..., own]), name


def test_the_output_is_the_concatenation_of_the_two_branches():
    m = _layer(conv="dynamic", glu=True)
    x = _x()
    out = m(x).out
    assert_close(out[..., :16], m.attn(x[..., :16]).out, rtol=0, atol=0)
    assert_close(out[..., 16:], m.conv(x[..., 16:], causal=False)[0], rtol=0, atol=0)


@pytest.mark.parametrize("fields", CONVS, ids=["lightweight", "dynamic-glu", "dynamic"])
def test_conv_channels_are_local_and_attention_channels_global(fields):
    """What tells LSRA from dense attention (and from a no-op): a token further than K//2 away
    leaves the convolution channels of a position untouched and changes its attention ones."""
    m = _layer(kernel_sizes=(5,), **fields)
    x = _x()
    base = m(x).out
    x2 = x.clone()
    x2[:, 0] += 1.0
    out = m(x2).out
    far = slice(3, T)  # positions >= K//2 + 1 from token 0
    assert_close(out[:, far, 16:], base[:, far, 16:], rtol=0, atol=0)
    assert not torch.allclose(out[:, far, :16], base[:, far, :16])
    assert not torch.allclose(out[:, 1, 16:], base[:, 1, 16:])  # within the kernel


def test_lsra_differs_from_dense_attention_of_the_same_width():
    for fields in CONVS:
        m = _layer(**fields)
        dense = _layer(attention_fraction=1.0, **fields)
        x = _x()
        assert dense.conv is None and dense.attn.dim == D
        assert_close(dense(x).out, dense.dense_reference(x))
        out = m(x).out
        assert not torch.allclose(out, dense(x).out, atol=1e-3)
        assert not torch.allclose(out[..., 16:], torch.zeros_like(out[..., 16:]))


@pytest.mark.parametrize("fields", CONVS, ids=["lightweight", "dynamic-glu", "dynamic"])
def test_decoder_causality_is_exact(fields):
    for k in (3, 31):  # inside and longer than the sequence
        m = _layer(causal=True, kernel_sizes=(k,), **fields)
        mask = AttentionMask(causal=True)
        x = _x()
        base = m(x, mask=mask).out
        for t0 in (1, 7, T - 1):
            x2 = x.clone()
            x2[:, t0:] = torch.randn(B, T - t0, D, dtype=x.dtype)
            out = m(x2, mask=mask).out
            assert_close(out[:, :t0], base[:, :t0], rtol=0, atol=0)
            assert not torch.allclose(out[:, t0:], base[:, t0:])


@pytest.mark.parametrize("fields", CONVS, ids=["lightweight", "dynamic-glu", "dynamic"])
@pytest.mark.parametrize("k", [1, 4, 31])
def test_incremental_decoding_equals_full_recompute(fields, k):
    m = _layer(causal=True, kernel_sizes=(k,), **fields)
    mask = AttentionMask(causal=True)
    x = _x()
    full = m(x, mask=mask).out
    state = m.init_decoding_state(B, dtype=x.dtype)
    assert isinstance(state, LSRAState) and state.conv.shape == (B, k - 1, D // 2)
    steps = []
    for t in range(T):
        o = m(x[:, t : t + 1], mask=mask, state=state)
        state = o.state
        steps.append(o.out)
    assert_close(torch.cat(steps, 1), full, rtol=1e-12, atol=1e-12)
    assert state.length == T
    # chunks of several tokens
    state = m.init_decoding_state(B, dtype=x.dtype)
    chunks = []
    for lo, hi in ((0, 6), (6, 7), (7, T)):
        o = m(x[:, lo:hi], mask=mask, state=state)
        state = o.state
        chunks.append(o.out)
    assert_close(torch.cat(chunks, 1), full, rtol=1e-12, atol=1e-12)


def test_reordering_the_decoding_state_picks_rows_of_both_branches():
    m = _layer(causal=True, conv="dynamic", glu=True)
    mask = AttentionMask(causal=True)
    x = _x(batch=3)
    state = m.init_decoding_state(3, dtype=x.dtype)
    for t in range(4):
        state = m(x[:, t : t + 1], mask=mask, state=state).state
    idx = torch.tensor([2, 2, 0])
    re = m.reorder_decoding_state(state, idx)
    assert_close(re.conv, state.conv[idx], rtol=0, atol=0)
    assert_close(re.attn.k, state.attn.k[idx], rtol=0, atol=0)
    nxt = x[idx, 4:5]
    want = m(x[idx, :5], mask=mask).out[:, 4:5]
    assert_close(m(nxt, mask=mask, state=re).out, want, rtol=1e-12, atol=1e-12)


def test_padded_inputs_are_zeroed_so_outputs_do_not_depend_on_the_padding():
    """A sentence encodes the same alone and padded in a batch (the official code zeroes the
    branch input before its biased input linear, which leaks bias into the neighbours)."""
    m = _layer(conv="dynamic", glu=True, kernel_sizes=(7,))
    x = _x(t=12)
    alone = m(x[:1, :8]).out
    real = torch.zeros(2, 12, dtype=torch.bool)
    real[0, :8] = True
    real[1] = True
    x2 = x.clone()
    x2[0, 8:] = 5.0
    padded = m(x2, mask=AttentionMask(key_padding=real)).out
    assert_close(padded[:1, :8], alone, rtol=1e-12, atol=1e-12)


def test_kernel_sizes_vary_by_layer():
    config = LSRAConfig()
    assert config.kernel_sizes == (3, 7, 15, 31, 31, 31)
    got = [
        LSRAAttention.from_config(config, AttentionDims(D, 2, 16, False, layer=i, n_layers=6))
        for i in range(6)
    ]
    assert [m.conv.kernel_size for m in got] == [3, 7, 15, 31, 31, 31]
    assert config.for_layer(1, 3).kernel_sizes == (7,)  # cut to the depth
    one = LSRAConfig(kernel_sizes=(9,))
    assert one.for_layer(4, 6) is one
    with pytest.raises(ConfigError, match="kernel_sizes"):
        config.for_layer(0, 8)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="attention.conv"):
        LSRAConfig(conv="fft")
    with pytest.raises(ConfigError, match="attention.kernel_sizes"):
        LSRAConfig(kernel_sizes=(3, 0))
    with pytest.raises(ConfigError, match="attention.attention_fraction"):
        LSRAConfig(attention_fraction=1.5)
    with pytest.raises(ConfigError, match="attention.weight_dropout"):
        LSRAConfig(weight_dropout=1.0)
    with pytest.raises(ConfigError, match="conv1d"):
        LSRAConfig(conv="dynamic", method="conv1d")
    with pytest.raises(ConfigError, match="attn_heads"):
        branch_widths(LSRAConfig(attn_heads=3), 32)
    with pytest.raises(ConfigError, match="conv_heads"):
        branch_widths(LSRAConfig(conv_heads=5), 32)
    with pytest.raises(ConfigError, match="whole number"):
        branch_widths(LSRAConfig(attention_fraction=0.3), 32)
    with pytest.raises(ConfigError, match="lightweight"):
        LightConvConfig(conv="dynamic")
    assert attention_config({"name": "lsra", "kernel_sizes": "31"}).kernel_sizes == (31,)
    assert attention_config({"name": "lsra", "kernel_sizes": [3, 5]}).kernel_sizes == (3, 5)


def test_bad_inputs_are_refused_with_a_clear_error():
    m = _layer(causal=True)
    x = _x()
    with pytest.raises(ValueError, match="kv"):
        m(x, kv=x)
    with pytest.raises(ValueError, match="causal"):
        m(x, state=m.init_decoding_state(B, dtype=x.dtype))
    with pytest.raises(ValueError, match="LSRAState"):
        m(x, mask=AttentionMask(causal=True), state=object())


def test_pay_less_attention_parts_are_convolutions_over_every_channel():
    for cls, dynamic in ((LightConvConfig, False), (DynamicConvConfig, True)):
        config = cls()
        assert config.attention_fraction == 0.0 and config.conv_heads == 16 and config.glu
        assert config.kernel_sizes == (3, 7, 15, 31, 31, 31, 31)
        dims = AttentionDims(D, 2, 16, False, layer=3, n_layers=7)
        m = LSRAAttention.from_config(config, dims).double()
        assert m.attn is None and m.conv.dim == D and m.conv.dynamic is dynamic
        assert m.conv.kernel_size == 31 and m.conv.linear1.out_features == 2 * D
        x = _x()
        assert m(x).out.shape == x.shape


def test_mult_adds_equal_a_hand_count():
    """The checklist's toy layer: d 8 (halves of 4), n 5, K 3, 4 heads / 4 groups."""
    n, d, k, h = 5, 8, 3, 4
    c = d // 2
    dims = AttentionDims(d, 2, 4, False, layer=0, n_layers=1)
    attn = 4 * n * c * c + 2 * n * n * c
    for fields in CONVS:
        config = LSRAConfig(kernel_sizes=(k,), **fields)
        conv = 2 * n * c * c + (n * c * c if fields["glu"] else 0) + n * c * k
        if fields["conv"] == "dynamic":
            conv += n * c * h * k
        assert LSRAAttention.mult_adds(config, dims, n, n, taps=True) == attn + conv
        assert LSRAAttention.mult_adds(config, dims, n, n) == attn + conv - n * c * k
    dense = DenseAttention.mult_adds(dataclasses.replace(attention_config("dense")), dims, n, n)
    assert dense == 4 * n * d * d + 2 * n * n * d
