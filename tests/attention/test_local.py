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
