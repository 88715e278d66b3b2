"""Reversible two-stream stack: its custom backward equals ordinary autograd through the same
two-stream network (float64, dropout on, LSH and local attention, chunked FFN, aux losses), it
reconstructs inputs from outputs, memory held for the backward does not grow with depth
(measured with saved-tensor hooks), and it refuses what it cannot carry. Also: the chunked
feed-forward equals the unchunked one bit for bit, the chunked loss equals the plain loss, and
the axial encodings follow trax's concatenation rule."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer.attention import AttentionDims, AttentionMask, AttentionOutput, PrepareContext
from effiformer.attention.local import LocalAttention, LocalConfig
from effiformer.attention.lsh import LSHConfig, LSHPlan
from effiformer.attention.pattern import PatternConfig
from effiformer.attention.registry import build_attention
from effiformer.layers import FeedForward, TransformerBlock
from effiformer.layers.chunked import ChunkedFeedForward, chunk_slices, chunked_lm_loss
from effiformer.layers.positions import AxialPositions
from effiformer.layers.reversible import ReversibleBlock, ReversibleStack, _forward_layers, _Run
from effiformer.models.base import lm_loss

D, H, T = 16, 2, 48


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class _AuxLocal(LocalAttention):
    """Local attention that also returns an aux loss and an update (for threading tests)."""

    def forward(self, x, **kw):
        a = super().forward(x, **kw)
        return AttentionOutput(
            out=a.out, aux={"pen": 0.1 * a.out.pow(2).mean()}, updates={"buf": a.out.mean(0)}
        )


PATTERN = PatternConfig(layers=(LocalConfig(window=8), LSHConfig(chunk_len=8, n_hashes=2)))


def _stack(n, *, reversible=True, attention=PATTERN, dropout=0.1, aux=False, ffn_chunk=16):
    torch.manual_seed(0)
    blocks = []
    for i in range(n):
        dims = AttentionDims(D, H, D // H, causal=True, dropout=dropout, layer=i, n_layers=n)
        if aux and i % 2 == 0:
            attn = _AuxLocal.from_config(LocalConfig(window=8), dims)
        else:
            attn = build_attention(attention, dims)
        ffn = FeedForward(D, 4 * D, dropout=dropout)
        blocks.append(ReversibleBlock(D, attn, ffn, dropout=dropout, ffn_chunk=ffn_chunk))
    return ReversibleStack(blocks, reversible=reversible).double().train()


def _ctx(x, mask):
    return PrepareContext(
        tq=x.shape[1], tk=x.shape[1], mask=mask, device=x.device, dtype=x.dtype, training=True,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip


def _run(stack, x, seed=5):
    mask = AttentionMask(causal=True)
    torch.manual_seed(seed)
    return stack(x, mask=mask, ctx=_ctx(x, mask))


@pytest.mark.parametrize("aux", [False, True])
def test_custom_backward_equals_autograd_on_the_same_two_stream_network(aux):
    results = []
    for reversible in (True, False):
        stack = _stack(4, reversible=reversible, aux=aux)
        x = torch.randn(2, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        x.requires_grad_()
        out = _run(stack, x)
        w = torch.randn(
            out.hidden.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
        )
        loss = (out.hidden * w).sum() + sum(out.aux.values(), torch.zeros((), dtype=torch.float64))
        loss.backward()
        results.append((out, x.grad, {n: p.grad for n, p in stack.named_parameters()}))
    (o_r, gx_r, gp_r), (o_p, gx_p, gp_p) = results
    assert torch.equal(o_r.hidden, o_p.hidden)  # same forward, bit for bit
    assert o_r.aux.keys() == o_p.aux.keys() and o_r.updates.keys() == o_p.updates.keys()
    if aux:
        assert set(o_r.aux) == {"0.pen", "2.pen"} and set(o_r.updates) == {
            "0.attn.buf",
            "2.attn.buf",
        }
    assert_close(gx_r, gx_p, rtol=1e-10, atol=1e-10)
    assert gp_r.keys() == gp_p.keys()
    for name in gp_p:
        assert gp_p[name] is not None and gp_r[name] is not None, name
        assert_close(gp_r[name], gp_p[name], rtol=1e-10, atol=1e-10, msg=name)


def test_dropout_is_on_and_changes_the_output():
    stack = _stack(2)
    x = torch.randn(2, T, D, dtype=torch.float64)
    a, b = _run(stack, x, seed=5).hidden, _run(stack, x, seed=6).hidden
    assert not torch.allclose(a, b)


def test_inputs_are_reconstructed_from_outputs():
    stack = _stack(6).float()
    x = torch.randn(2, T, D)
    mask = AttentionMask(causal=True)
    ctx = _ctx(x, mask)
    positions = [stack._prepared(i, ctx, T, {}) for i in range(len(stack))]
    seeds = [(11 + 2 * i, 12 + 2 * i) for i in range(len(stack))]
    run = _Run(list(stack), mask, positions, seeds, [], collect=True)
    with torch.no_grad():
        y1, y2, _, replays = _forward_layers(run, x, x)
        from effiformer.layers.reversible import _seeded

        for i in range(len(stack) - 1, -1, -1):
            block = stack[i]
            with _seeded(seeds[i][1], x.device):
                x2 = y2 - block.g(y1)
            with _seeded(seeds[i][0], x.device):
                x1 = y1 - block.f(x2, mask=mask, positions=replays[i]).out
            y1, y2 = x1, x2
    assert (y1 - x).abs().max() < 1e-5 and (y2 - x).abs().max() < 1e-5
    assert isinstance(replays[1], LSHPlan) and replays[1].buckets is not None


def _saved_bytes(stack, x) -> int:
    """Bytes of every tensor storage the forward leaves to autograd for the backward (packed
    while the forward runs; parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in stack.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = _run(stack, x)
    out.hidden.sum().backward()  # the backward still runs (and recomputes) outside the count
    return sum(seen.values())


def test_memory_held_for_backward_does_not_grow_with_depth():
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    local = LocalConfig(window=8)
    rev = {n: _saved_bytes(_stack(n, attention=local), x) for n in (2, 8)}
    assert rev[2] == rev[8], rev
    plain = {n: _saved_bytes(_stack(n, attention=local, reversible=False), x) for n in (2, 8)}
    assert plain[8] > 3 * plain[2] and plain[2] > rev[2], (plain, rev)
    # With LSH layers the only growth is each extra LSH layer's replayed buckets (int32) and
    # rotations (float32): bookkeeping of O(n_hashes * T) numbers, not activations.
    lsh = {n: _saved_bytes(_stack(n), x) for n in (2, 8)}
    n_hashes, padded, buckets = 2, T, 2 * (T // 8)
    per_lsh_layer = 2 * H * n_hashes * padded * 4 + H * (D // H) * n_hashes * (buckets // 2) * 4
    assert lsh[8] - lsh[2] == 3 * per_lsh_layer, (lsh, per_lsh_layer)
    assert per_lsh_layer < 2 * x.numel() * 8  # smaller than one stream's activations


def test_backward_runs_under_the_flop_counter():
    # FlopCounterMode's module tracker hooks module inputs; the recompute must not hand it leaves
    from torch.utils.flop_counter import FlopCounterMode

    stack = _stack(2)
    x = torch.randn(1, T, D, dtype=torch.float64, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        _run(stack, x).hidden.sum().backward()
    assert counter.get_total_flops() > 0 and x.grad is not None


def test_eval_returns_no_aux_and_needs_no_grad():
    stack = _stack(2, aux=True).eval()
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        out = _run(stack, x)
    assert out.aux == {} and out.updates == {} and out.hidden.shape == (2, T, 2 * D)


def test_refuses_what_it_cannot_carry():
    stack = _stack(2)
    x = torch.randn(1, T, D, dtype=torch.float64)
    mask = AttentionMask(causal=True)
    with pytest.raises(ValueError, match="state"):
        stack(x, mask=mask, ctx=_ctx(x, mask), state=(None, None))
    with pytest.raises(ValueError, match="block_kwargs"):
        stack(x, mask=mask, ctx=_ctx(x, mask), block_kwargs={"enc": x})
    dims = AttentionDims(D, H, D // H, causal=True)
    with pytest.raises(TypeError, match="ReversibleBlock"):
        ReversibleStack(
            [TransformerBlock(D, build_attention(LocalConfig(), dims), FeedForward(D, 32))]
        )
    with pytest.raises(TypeError, match="two streams"):
        stack[0](x)

    class GradPlan(LocalAttention):
        def prepare(self, ctx, shared):
            return (super().prepare(ctx, shared), torch.ones(1, requires_grad=True))

        def forward(self, x, *, positions=None, **kw):
            return super().forward(x, positions=positions[0], **kw)

    blk = ReversibleBlock(D, GradPlan.from_config(LocalConfig(), dims), FeedForward(D, 32))
    with pytest.raises(ValueError, match="require grad"):
        _run(ReversibleStack([blk]).double().train(), x.requires_grad_())


# ---------------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("t", [64, 65, 67, 100])
def test_chunked_ffn_is_bit_identical_to_unchunked(t):
    torch.manual_seed(0)
    ffn = FeedForward(32, 128).eval()
    x = torch.randn(3, t, 32)
    assert torch.equal(ChunkedFeedForward(ffn, 16)(x), ffn(x))
    # in training (no dropout), recomputed chunks give the same gradients
    ffn.train()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ChunkedFeedForward(ffn, 16)(xa), ffn(xb)
    assert torch.equal(ya, yb)
    ga = torch.autograd.grad(ya.pow(2).sum(), [xa, *ffn.parameters()])
    gb = torch.autograd.grad(yb.pow(2).sum(), [xb, *ffn.parameters()])
    # the weight gradients sum B*T rows in chunk order instead of one reduction: float32
    # reduction-order rounding (1.2e-6 on one element of 4,096 on this machine's CPU)
    for a, b in zip(ga, gb):
        assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_reversible_block_g_chunks_equal_unchunked_bit_for_bit():
    torch.manual_seed(0)
    dims = AttentionDims(D, H, D // H, causal=True)
    ffn = FeedForward(D, 4 * D)
    chunked = ReversibleBlock(D, build_attention(LocalConfig(), dims), ffn, ffn_chunk=7).eval()
    y = torch.randn(2, 50, D)
    assert torch.equal(chunked.g(y), chunked.g_chunk(y))


def test_chunk_slices_never_leave_a_short_tail():
    assert chunk_slices(10, 4) == [slice(0, 4), slice(4, 10)]
    assert chunk_slices(8, 4) == [slice(0, 4), slice(4, 8)]
    assert chunk_slices(3, 4) == [slice(0, 3)] == chunk_slices(3, None)


def test_chunked_loss_equals_the_plain_loss_and_its_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50)
    h = torch.randn(2, 37, 16, requires_grad=True)
    y = torch.randint(0, 50, (2, 37))
    y[0, :5] = -100
    a = chunked_lm_loss(h, head, y, 8)
    (ga,) = torch.autograd.grad(a, h)
    b = lm_loss(head(h), y)
    (gb,) = torch.autograd.grad(b, h)
    assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert_close(ga, gb, rtol=1e-5, atol=1e-7)


def test_axial_positions_follow_the_concatenation_rule():
    torch.manual_seed(0)
    ax = AxialPositions(24, (4, 8), (8, 16))
    assert sum(p.numel() for p in ax.parameters()) == 4 * 8 + 8 * 16  # n1 d1 + n2 d2
    x = torch.zeros(2, 30, 24)
    out = ax(x)
    for p in (0, 7, 8, 29):
        want = torch.cat([ax.e1[p // 8], ax.e2[p % 8]])
        assert torch.equal(out[1, p], want)
    assert_close(ax.e1.std(), torch.tensor(1.0), rtol=0.5, atol=0)  # N(0, 1) init
    with pytest.raises(ValueError, match="32"):
        ax(torch.zeros(1, 33, 24))
    with pytest.raises(ValueError, match="sum to dim"):
        AxialPositions(24, (4, 8), (8, 8))
    ax.dropout = 0.5
    ax.train()
    d = ax(torch.zeros(3, 30, 24)) - 0  # dropped features: one mask per example
    kept = d != 0
    assert torch.equal(kept, kept[:, :1].expand_as(kept))
