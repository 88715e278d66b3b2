"""Compressive Transformer: FIFO queues and their compression, the c=1 limit equals
Transformer-XL, and gradient isolation of the attention-reconstruction loss."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from effiformer import ConfigError, create_model
from effiformer.layers.compression import build_compression
from effiformer.layers.memory import push_and_evict, update_memory
from effiformer.models.compressive import CompressiveConfig, CompressiveTransformer
from effiformer.models.transformer_xl import TransformerXL, XLConfig

D = 32


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny ops: one intra-op thread is ~100x faster than two on a loaded shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _cfg(**over):
    cfg = dict(
        dim=D, n_heads=2, n_layers=2, ffn_dim=64, seq_len=8, mem_len=4, cmem_len=4,
        compression_rate=2, compression="mean", dropout=0.0,
    )  # fmt: skip
    cfg.update(over)
    return cfg


def _model(**over) -> CompressiveTransformer:
    torch.manual_seed(0)
    return CompressiveTransformer(CompressiveConfig(**_cfg(**over))).double().eval()


def _ids(b, t, seed=0, vocab=256):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def test_fifo_helpers():
    mem = torch.arange(3.0).view(1, 3, 1)
    h = torch.arange(3.0, 8.0).view(1, 5, 1)
    new, old = push_and_evict(mem, h, 4)
    assert new.flatten().tolist() == [4, 5, 6, 7] and old.flatten().tolist() == [0, 1, 2, 3]
    assert update_memory(mem, h, 4).flatten().tolist() == [4, 5, 6, 7]
    assert update_memory(mem, h, 0).shape == (1, 0, 1)
    with pytest.raises(ValueError, match="memory"):
        update_memory(torch.zeros(1, 2, 3), torch.zeros(2, 2, 3), 4)


def test_queue_contents_after_k_segments_with_tagged_activations():
    """Layer 0's input is the embedding: make token t embed to t * e_0 and follow the tags."""
    m = _model(seq_len=4)
    with torch.no_grad():
        w = torch.zeros(256, D, dtype=torch.float64)
        w[:, 0] = torch.arange(256, dtype=torch.float64) / D**0.5  # sqrt(D) scaling undone
        m.embed.emb_layers[0].weight.copy_(w)
    inputs = {}
    for i, blk in enumerate(m.blocks):
        blk.register_forward_pre_hook(
            lambda mod, args, i=i: inputs.setdefault(i, []).append(args[0])
        )
    stream = torch.arange(1, 25).view(1, 24)  # tags 1..24
    state = None
    for k in range(6):  # six segments of 4
        state = m(stream[:, 4 * k : 4 * k + 4], state=state).state
    mem0, cmem0 = state[0]
    assert mem0[0, :, 0].tolist() == [21, 22, 23, 24]
    # evicted so far: 4 zeros (initial memory), then tags 1..20; mean pool c=2 -> keep last 4
    assert cmem0[0, :, 0].tolist() == [13.5, 15.5, 17.5, 19.5]
    assert torch.count_nonzero(cmem0[..., 1:]) == 0
    # every layer: memory = last n_m inputs, each compressed slot = mean of c evicted inputs
    for i in range(2):
        hist = torch.cat([torch.zeros(1, 4, D, dtype=torch.float64), *inputs[i]], dim=1)
        mem, cmem = state[i]
        assert_close(mem, hist[:, -4:])
        evicted = hist[:, :-4]  # (1, 24, D)
        pooled = evicted.view(1, 12, 2, D).mean(2)
        assert_close(cmem, pooled[:, -4:])


def test_c1_mean_compression_equals_xl_with_memory_nm_plus_ncm():
    """c = 1 with an identity f_c (mean pooling of one slot): exactly Transformer-XL whose memory is
    n_m + n_cm, started from the same zero memory (full tensors)."""
    comp = _model(compression_rate=1, seq_len=4)
    torch.manual_seed(0)
    xl = TransformerXL(
        XLConfig(dim=D, n_heads=2, n_layers=2, ffn_dim=64, seq_len=4, mem_len=8, dropout=0.0)
    ).double()
    xl.load_state_dict(comp.state_dict(), strict=False)
    missing = set(comp.state_dict()) - set(xl.state_dict())
    assert not missing  # mean pooling has no parameters: the two models have the same weights
    xl.eval()
    xs = xl.init_state(2)
    xs = tuple(torch.zeros(2, 8, D, dtype=torch.float64) for _ in xs)
    cs = None
    for k in range(4):
        ids = _ids(2, 4, seed=k)
        co, xo = comp(ids, state=cs), xl(ids, state=xs)
        assert_close(co.logits, xo.logits)
        cs, xs = co.state, xo.state
        for (mem, cmem), xmem in zip(cs, xs):
            assert_close(torch.cat([cmem, mem], 1), xmem)


def test_compressed_memory_is_used_and_c_gt_1_differs_from_xl():
    m = _model(compression="conv", compression_rate=2, seq_len=4)
    ids = _ids(1, 4)
    state = m(_ids(1, 4, seed=1)).state
    poked = tuple((mem, cmem + 0.5) for mem, cmem in state)
    assert not torch.allclose(m(ids, state=poked).logits, m(ids, state=state).logits, atol=1e-6)


def test_max_and_most_used_compressions():
    old = torch.randn(2, 7, 3, dtype=torch.float64)
    mx = build_compression("max", 3, 2)(old)  # oldest remainder (1 slot) dropped
    assert_close(mx, old[:, 1:].view(2, 3, 2, 3).amax(2))
    usage = torch.tensor([[9.0, 1, 5, 3, 2, 8, 0], [0, 1, 2, 3, 4, 5, 6]], dtype=torch.float64)
    mu = build_compression("most_used", 3, 2)(old, usage)
    assert_close(mu[0], old[0, [2, 3, 5]])  # slot 0 dropped with the remainder, time order kept
    assert_close(mu[1], old[1, [4, 5, 6]])
    dil = build_compression("dilated_conv", 3, 4).double()  # dilations 1, 2
    old8 = torch.randn(2, 9, 3, dtype=torch.float64)
    out = dil(old8)  # (2, 2, 3): oldest remainder dropped, slots = last state of each group
    x = old8[:, 1:].transpose(1, 2)
    (c1, c2), (d1, d2) = dil.convs, dil.dilations
    y = c2(F.pad(c1(F.pad(x, (d1, 0))), (d2, 0)))
    assert_close(out, y[:, :, 3::4].transpose(1, 2))
    # receptive field: slot g depends on exactly the 4 states of its group
    for p in range(1, 9):
        poked = old8.clone()
        poked[:, p] += 1.0
        changed = ((dil(poked) - out).abs().sum((0, 2)) > 0).tolist()
        assert changed == [p <= 4, p > 4], p
    with pytest.raises(ValueError, match="usage"):
        build_compression("most_used", 3, 2)(old)


def test_most_used_keeps_the_slots_the_layer_attended_to_most():
    m = _model(compression="most_used", seq_len=4)
    state = m(_ids(1, 4, seed=1)).state
    ids = _ids(1, 4, seed=2)
    blk = m.blocks[1]
    mem, cmem = state[1]
    captured = {}
    blk.register_forward_pre_hook(lambda mod, args: captured.setdefault("x", args[0]))
    new = m(ids, state=state).state
    x = captured["x"]
    kv = torch.cat([cmem, mem, x], 1)
    pos = m.relative_positions(kv.shape[1], x, layer=1)
    from effiformer.attention import AttentionMask

    probs = blk.attn.attention_probs(x, kv=kv, mask=AttentionMask(causal=True), positions=pos)
    usage = probs.sum((1, 2))[:, 4:8]  # the 4 memory slots, all evicted by a 4-token segment
    top = torch.sort(torch.topk(usage, 2, dim=1).indices, dim=1).values
    assert_close(new[1][1][:, -2:], mem[0, top[0]][None])


def test_gradient_isolation_reconstruction_loss_trains_only_f_c():
    m = _model(compression="conv", seq_len=4).train()
    comp_params = {id(p) for p in m.compressors.parameters()}
    assert comp_params
    out1 = m(_ids(2, 4), targets=_ids(2, 4, seed=1))
    out2 = m(_ids(2, 4, seed=2), targets=_ids(2, 4, seed=3), state=out1.state)
    names = sorted(out2.aux)
    assert names == ["blocks.0.attn_reconstruction", "blocks.1.attn_reconstruction"]
    recon = sum(out2.aux.values())
    assert recon.dim() == 0 and recon.item() > 0
    out2.loss.backward(retain_graph=True)
    for name, p in m.named_parameters():
        if id(p) in comp_params:
            assert p.grad is None or torch.count_nonzero(p.grad) == 0, name
        else:
            assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name
    m.zero_grad(set_to_none=True)
    recon.backward()
    for name, p in m.named_parameters():
        if id(p) in comp_params:
            assert p.grad is not None and torch.count_nonzero(p.grad) > 0, name
        else:
            assert p.grad is None, name


def test_trainer_clips_task_and_reconstruction_gradients_as_separate_groups():
    """One backward of total_loss, then clip_gradients: the task parameters are clipped by their
    own norm and f_c by its own (full tensors), so the reconstruction gradient (100-1000x the task
    gradient in real runs: d 128, T 128) cannot shrink the task gradient as one global norm
    would."""
    from effiformer.train import clip_gradients

    m = _model(compression="conv", seq_len=4).train()
    assert {id(p) for p in m.aux_parameters()} == {id(p) for p in m.compressors.parameters()}
    out1 = m(_ids(2, 4), targets=_ids(2, 4, seed=1))
    out2 = m(_ids(2, 4, seed=2), targets=_ids(2, 4, seed=3), state=out1.state)
    out2.total_loss.backward()
    aux_ids = {id(p) for p in m.aux_parameters()}
    task = [p for p in m.parameters() if id(p) not in aux_ids]
    aux = m.aux_parameters()
    norm = lambda ps: torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ps]))  # noqa: E731
    n_task, n_aux = norm(task), norm(aux)
    assert n_aux > 0 and n_task > 0.01
    before = {id(p): p.grad.clone() for p in m.parameters()}
    got = clip_gradients(m, 0.01)
    assert got.task == pytest.approx(n_task.item()) and got.aux == pytest.approx(n_aux.item())
    assert got.own is None  # no part here clips anything apart
    for ps, n in ((task, n_task), (aux, n_aux)):
        scale = min(1.0, 0.01 / (n.item() + 1e-6))
        for p in ps:
            assert_close(p.grad, before[id(p)] * scale)
    # a global norm would have scaled the task gradient by 0.01 / ||(task, aux)|| instead
    joint = 0.01 / torch.sqrt(n_task**2 + n_aux**2)
    assert joint < 0.9 * min(1.0, 0.01 / n_task.item())
    # models without auxiliary-only parameters: one group, no aux norm
    xl = TransformerXL(XLConfig(dim=D, n_heads=2, n_layers=1, ffn_dim=64, seq_len=4, mem_len=4))
    xl(_ids(1, 4), targets=_ids(1, 4, seed=1)).loss.backward()
    assert clip_gradients(xl, 1.0)[1] is None


def test_every_parameter_keeps_training_after_several_steps():
    """The lucidrains trap: an in-place detach_ froze key/value weights after the first step."""
    m = _model(compression="dilated_conv", seq_len=4).train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    state = None
    for k in range(4):
        out = m(_ids(2, 4, seed=k), targets=_ids(2, 4, seed=k + 10), state=state)
        opt.zero_grad()
        out.total_loss.backward()
        opt.step()
        state = out.state
    for n, p in m.named_parameters():
        assert p.requires_grad, n
        assert not torch.equal(p.detach(), before[n]), n


def test_no_reconstruction_loss_without_gradients_or_parameters():
    m = _model(compression="conv", seq_len=4)
    with torch.no_grad():
        assert m(_ids(1, 4)).aux == {}
    assert _model(compression="mean", seq_len=4).train()(_ids(1, 4)).aux == {}


def test_config_errors_and_registry():
    with pytest.raises(ConfigError, match="compression"):
        CompressiveConfig(**_cfg(compression="avg"))
    with pytest.raises(ConfigError, match="cmem_len"):
        CompressiveConfig(**_cfg(cmem_len=-1))
    with pytest.raises(ConfigError, match="compression_rate"):
        CompressiveConfig(**_cfg(compression_rate=0))
    c = create_model("compressive-tiny").config
    assert (c.mem_len, c.cmem_len, c.compression) == (16, 16, "conv")
    from effiformer import get_config

    e = get_config("compressive-enwik8")
    assert (e.n_layers, e.seq_len, e.mem_len, e.cmem_len, e.compression_rate) == (
        24, 768, 768, 1152, 3
    )  # fmt: skip
    w = get_config("compressive-wt103")
    assert (w.n_layers, w.seq_len, w.mem_len, w.cmem_len, w.compression_rate) == (
        18, 512, 512, 512, 4
    )  # fmt: skip
    assert w.adaptive and w.div_val == 4
