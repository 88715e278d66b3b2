"""The Reformer family: registered sizes match the paper/trax, the reversible model's gradients
equal the same model under ordinary autograd, chunked loss equals the plain loss, n_hashes is a
runtime setting that changes no weights, and the model learns."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model, get_config
from effiformer.attention.local import LocalConfig
from effiformer.attention.lsh import LSHAttention, LSHConfig
from effiformer.attention.pattern import PatternConfig
from effiformer.config import ConfigError
from effiformer.models.reformer import ReformerConfig, ReformerLM, reconfigure


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_enwik8_config_is_the_papers():
    c = get_config("reformer-enwik8")
    assert (c.n_layers, c.dim, c.n_heads, c.head_dim, c.ffn_dim) == (12, 1024, 8, 64, 4096)
    assert isinstance(c.attention, PatternConfig)
    kinds = [c.attention.for_layer(i, 12).name for i in range(12)]
    assert kinds == ["local", "local", "lsh", "local"] * 3
    lsh = c.attention.for_layer(2, 12)
    assert (lsh.chunk_len, lsh.n_hashes, lsh.n_buckets) == (256, 2, 512)
    assert c.attention.for_layer(0, 12).window == 128
    assert c.axial_shape == (128, 512) and c.axial_dims == (256, 768) and c.seq_len == 65536
    small, vanilla = get_config("reformer-small"), get_config("vanilla-small")
    assert (small.dim, small.n_heads, small.n_layers, small.ffn_dim, small.seq_len) == (
        vanilla.dim, vanilla.n_heads, vanilla.n_layers, vanilla.ffn_dim, vanilla.seq_len,
    )  # fmt: skip


def _pair(**over):
    cfg = dict(dropout=0.1, attn_dropout=0.1, n_layers=3, ffn_chunk=24)
    cfg.update(over)
    torch.manual_seed(0)
    rev = create_model("reformer-tiny", **cfg).double().train()
    plain = create_model("reformer-tiny", reversible=False, **cfg).double().train()
    plain.load_state_dict(rev.state_dict())
    return rev, plain


def test_reversible_model_gradients_equal_ordinary_autograd():
    rev, plain = _pair(
        attention=PatternConfig(
            layers=(LSHConfig(chunk_len=16, n_hashes=2), LocalConfig(window=16))
        )
    )
    ids = torch.randint(0, 256, (2, 97), generator=torch.Generator().manual_seed(1))
    grads = []
    for m in (rev, plain):
        torch.manual_seed(3)
        out = m(ids[:, :-1], targets=ids[:, 1:])
        out.total_loss.backward()
        grads.append((out.loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    assert torch.equal(grads[0][0], grads[1][0])
    for name, g in grads[1][1].items():
        assert_close(grads[0][1][name], g, rtol=1e-9, atol=1e-11, msg=name)


def test_chunked_loss_equals_the_plain_loss():
    torch.manual_seed(0)
    m = create_model("reformer-tiny", loss_chunk=None).eval()
    chunked = create_model("reformer-tiny", loss_chunk=16).eval()
    chunked.load_state_dict(m.state_dict())
    ids = torch.randint(0, 256, (2, 70))
    torch.manual_seed(1)
    a = m(ids[:, :-1], targets=ids[:, 1:])
    torch.manual_seed(1)
    b = chunked(ids[:, :-1], targets=ids[:, 1:])
    assert b.logits is None and a.logits is not None
    assert_close(a.loss, b.loss, rtol=1e-6, atol=1e-6)


def test_n_hashes_is_a_runtime_setting():
    torch.manual_seed(0)
    m = create_model("reformer-tiny").eval()
    more = reconfigure(m, n_hashes=8)
    assert all(b.attn.config.n_hashes == 8 for b in more.blocks if isinstance(b.attn, LSHAttention))
    assert all(
        torch.equal(a, b) for a, b in zip(m.state_dict().values(), more.state_dict().values())
    )
    ids = torch.randint(0, 256, (1, 64))
    assert torch.isfinite(more(ids).logits).all()
    with pytest.raises(ConfigError, match="dim"):
        reconfigure(m, dim=32)
    v = create_model("vanilla-tiny", seq_len=64, attention={"name": "lsh", "chunk_len": 8})
    assert reconfigure(v, n_hashes=4).blocks[0].attn.config.n_hashes == 4


def test_config_validation():
    with pytest.raises(ConfigError, match="axial_shape"):
        ReformerConfig(seq_len=100, axial_shape=(8, 8))
    with pytest.raises(ConfigError, match="axial_dims"):
        ReformerConfig(dim=64, axial_dims=(16, 16))
    with pytest.raises(ConfigError, match="ffn_chunk"):
        ReformerConfig(ffn_chunk=0)
    c = ReformerConfig(seq_len=1000, dim=64)
    (n1, n2), dims = c.axial
    assert n1 * n2 >= 1000 and sum(dims) == 64 and c.axial_shape is None
    longer = get_config("reformer-tiny", seq_len=4096)  # the derived shape follows seq_len
    assert longer.axial[0][0] * longer.axial[0][1] >= 4096


def test_padding_mask_and_eval_forward():
    torch.manual_seed(0)
    m = create_model("reformer-tiny").eval()
    ids = torch.randint(0, 256, (2, 40))
    am = torch.ones(2, 40, dtype=torch.long)
    am[1, 30:] = 0
    out = m(ids, attention_mask=am)
    assert out.logits.shape == (2, 40, 256) and torch.isfinite(out.logits).all()
    assert out.hidden.shape == (2, 40, 128)  # concat of the two streams, normalised


def test_the_model_learns_a_repeated_pattern():
    torch.manual_seed(0)
    m = create_model("reformer-tiny", n_layers=1).train()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    ids = torch.arange(64).repeat(1, 2) % 16  # (1, 128)
    first = None
    for _ in range(30):
        loss = m(ids[:, :-1], targets=ids[:, 1:]).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first
    assert isinstance(m, ReformerLM)
