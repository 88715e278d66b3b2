"""Adaptive Attention Span: the soft mask, the layout (the S previous positions, not the query
itself), trimming, the span-sized cache, the penalty, the clamp, and spans that move the right
way when trained."""

import pytest
import torch
from torch.testing import assert_close

import effiformer.train.loop as train_loop
from effiformer import create_model
from effiformer.attention import AttentionDims, AttentionMask
from effiformer.attention.adaptive_span import (
    AdaptiveSpanAttention,
    AdaptiveSpanConfig,
    SpanPositions,
    SpanShared,
    _choose_chunk,
    _skew,
    adaptive_span_reference,
    soft_mask,
)
from effiformer.bench.spans import format_span_report, plot_span_report, span_report
from effiformer.config import ConfigError
from effiformer.data import read_text
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, after_optimizer_step, train


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


D, H, DH = 16, 2, 8


def _part(seed=0, p=None, **cfg):
    """A float64 part and its shared key_pe; ``p``: the spans' p per head."""
    config = AdaptiveSpanConfig(**cfg)
    dims = AttentionDims(D, H, DH, causal=True)
    torch.manual_seed(seed)
    m = AdaptiveSpanAttention.from_config(config, dims).double()
    shared = AdaptiveSpanAttention.build_shared(config, dims).double()
    if p is not None:
        with torch.no_grad():
            m.current_val.copy_(torch.as_tensor(p, dtype=torch.float64))
    return m, SpanPositions(shared.key_pe)


def _inputs(tq, mem, seed=1, b=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, tq, D, generator=g, dtype=torch.float64)
    kv = torch.cat([torch.randn(b, mem, D, generator=g, dtype=torch.float64), x], dim=1)
    return x, kv


def _distance(tq, tk):
    return (torch.arange(tq)[:, None] + tk - tq) - torch.arange(tk)[None, :]  # (Tq, Tk)


# ---- the mask ---------------------------------------------------------------------------------


def test_soft_mask_is_the_formula_and_p0_leaves_only_distances_below_r():
    r = 8
    x = torch.arange(0, 40, dtype=torch.float64)
    for z in (0.0, 3.5, 12.0, 30.25):
        want = torch.tensor([min(1.0, max(0.0, (r + z - xi) / r)) for xi in x.tolist()])
        assert_close(soft_mask(x, torch.tensor(z, dtype=torch.float64), r), want.double())
    # p = 0: z = 0, so only distances x < R have a non-zero mask, and the weights too.
    m, pos = _part(p=[0.0, 0.0], max_span=32, ramp=r)
    x_, kv = _inputs(tq=16, mem=24)
    probs = m.attention_probs(x_, kv=kv, mask=AttentionMask(causal=True), positions=pos)
    dist = _distance(16, 40).expand_as(probs)
    assert (probs[dist >= r] == 0).all()
    near = (dist >= 1) & (dist < r)
    assert (probs[near] > 0).all()


def test_rows_sum_to_one_and_weights_beyond_z_plus_r_are_exactly_zero():
    s, r = 48, 8
    p = torch.tensor([0.15, 0.6], dtype=torch.float64)  # z = 7.2 and 28.8
    m, pos = _part(p=p, max_span=s, ramp=r)
    x, kv = _inputs(tq=20, mem=40)
    probs = m.attention_probs(x, kv=kv, mask=AttentionMask(causal=True), positions=pos)
    assert_close(probs.sum(-1), torch.ones(2, H, 20, dtype=torch.float64), rtol=0, atol=1e-7)
    dist = _distance(20, 60)
    for h, z in enumerate((p * s).tolist()):
        ph = probs[:, h]  # (B, Tq, Tk)
        assert (ph[:, dist >= z + r] == 0).all()
        assert (ph[:, (dist >= 1) & (dist < z + r)] > 0).all()
    # Forward's (trimmed, chunked) output is these weights times the values.
    out = m(x, kv=kv, mask=AttentionMask(causal=True), positions=pos).out
    v = m._heads(m.v_proj(kv))
    want = m.o_proj((probs @ v).transpose(1, 2).reshape(2, 20, -1))
    assert_close(out, want, rtol=1e-10, atol=1e-10)


def test_the_ramp_passes_its_gradient_to_p():
    """The trap: masking the ramp with -inf would leave p without a gradient from the task."""
    m, pos = _part(p=[0.1, 0.3], max_span=48, ramp=8, penalty=0.0)
    x, kv = _inputs(tq=12, mem=30)
    out = m(x, kv=kv, mask=AttentionMask(causal=True), positions=pos).out
    (out**2).sum().backward()
    assert (m.current_val.grad.abs() > 0).all()


def test_gradcheck_float64():
    """Gradients w.r.t. the inputs, p and key_pe (z = 5.04 and 11.28 sit between integer
    distances, where the mask is differentiable; the window does not move within eps)."""
    m, pos = _part(max_span=24, ramp=4, trim_step=4)
    x, kv = _inputs(tq=6, mem=10, b=1)
    mask = AttentionMask(causal=True)

    def f(x_, kv_, p_, pe_):
        return torch.func.functional_call(
            m, {"current_val": p_}, (x_,), dict(kv=kv_, mask=mask, positions=SpanPositions(pe_))
        ).out

    p = torch.tensor([0.21, 0.47], dtype=torch.float64)
    args = (x, kv, p, pos.key_pe.detach())
    args = tuple(a.clone().requires_grad_() for a in args)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6)


# ---- the layout -------------------------------------------------------------------------------


def test_a_query_attends_to_the_previous_positions_not_itself():
    m, pos = _part(p=[1.0, 1.0], max_span=64, ramp=8)
    x, kv = _inputs(tq=10, mem=5)
    mask = AttentionMask(causal=True)
    probs = m.attention_probs(x, kv=kv, mask=mask, positions=pos)
    dist = _distance(10, 15)
    assert (probs[..., dist == 0] == 0).all() and (probs[..., dist == 1] > 0).all()
    # The first query of a segment without memory has no key: its attention output is 0.
    out = m(x, mask=mask, positions=pos).out
    assert_close(out[:, 0], torch.zeros(2, D, dtype=torch.float64), rtol=0, atol=0)
    # With include_self the query sees itself too.
    m2, pos2 = _part(p=[1.0, 1.0], max_span=64, ramp=8, include_self=True)
    probs2 = m2.attention_probs(x, kv=kv, mask=mask, positions=pos2)
    assert (probs2[..., dist == 0] > 0).all()


def test_include_self_degenerate_limit_is_plain_causal_dense_attention():
    from effiformer.attention.base import AttentionPart

    cfg = AdaptiveSpanAttention.degenerate_config(AdaptiveSpanConfig(include_self=True), 32)
    m, pos = _part(**{k: getattr(cfg, k) for k in ("max_span", "ramp", "include_self", "eps")})
    m.make_dense_equivalent_()
    with torch.no_grad():
        pos.key_pe.zero_()
    x, _ = _inputs(tq=32, mem=0)
    mask = AttentionMask(causal=True)
    out = m(x, mask=mask, positions=pos).out
    want = AttentionPart.dense_reference(m, x, mask=mask)  # the base class: plain causal dense
    assert_close(out, want, rtol=1e-10, atol=1e-10)


def test_position_embedding_is_shared_by_all_layers_and_heads():
    model = create_model("adaptive-span-tiny")
    pes = [p for n, p in model.named_parameters() if n.endswith("key_pe")]
    assert len(pes) == 1 and pes[0].shape == (1, model.config.head_dim, 128)
    ids = torch.randint(0, 256, (2, 32))
    model(ids, targets=ids).total_loss.backward()
    assert pes[0].grad is not None and pes[0].grad.abs().sum() > 0
    # Random-normal, as the official code, kept by the model's init (keep_init).
    assert 0.8 < float(pes[0].detach().std()) < 1.2
    # In the dense family too.
    vanilla = create_model("vanilla-tiny", attention={"name": "adaptive_span", "max_span": 64})
    pe = [p for n, p in vanilla.named_parameters() if n.endswith("key_pe")]
    assert len(pe) == 1 and 0.8 < float(pe[0].detach().std()) < 1.2


def test_key_pe_std_scales_the_init_and_zero_starts_every_distance_alike():
    torch.manual_seed(3)
    one = SpanShared(DH, 64).key_pe.detach()
    torch.manual_seed(3)
    half = SpanShared(DH, 64, std=0.5).key_pe.detach()
    torch.manual_seed(3)
    zero = SpanShared(DH, 64, std=0.0).key_pe.detach()
    # The same draw, scaled: the other parameters' initialisation does not move with the std.
    assert_close(half, 0.5 * one, rtol=0, atol=0)
    assert torch.equal(zero, torch.zeros_like(one)) and float(one.std()) > 0.8
    # Through a model (keep_init: the model's own initialisation leaves it alone).
    att = {"name": "adaptive_span", "max_span": 64, "key_pe_std": 0.0}
    model = create_model("vanilla-tiny", attention=att)
    (pe,) = [p for n, p in model.named_parameters() if n.endswith("key_pe")]
    assert torch.equal(pe.detach(), torch.zeros_like(pe))


def test_the_dense_at_init_ablation_is_causal_dense_attention_without_any_reset():
    """The quality suite's ``adaptive-span-dense`` row starts as dense attention: with its
    settings as they come (no make_dense_equivalent_), the part's output is plain causal dense
    attention over the same projections, and the default settings' output is not."""
    from effiformer.attention.base import AttentionPart
    from effiformer.bench.mechanisms import mechanism_settings

    settings = dict(mechanism_settings("adaptive-span-dense", "mqar", 32))
    settings.pop("name")
    m, pos = _part(**settings)
    x, _ = _inputs(tq=32, mem=0)
    mask = AttentionMask(causal=True)
    want = AttentionPart.dense_reference(m, x, mask=mask)
    # rtol 1e-7: the renormalisation's eps (1e-8) is all that differs
    assert_close(m(x, mask=mask, positions=pos).out, want, rtol=1e-7, atol=1e-9)
    plain = dict(mechanism_settings("adaptive-span", "mqar", 32))
    plain.pop("name")
    m2, pos2 = _part(**plain)
    out2 = m2(x, mask=mask, positions=pos2).out
    assert (out2 - AttentionPart.dense_reference(m2, x, mask=mask)).abs().max() > 1e-2


def test_projections_have_no_biases():
    m, _ = _part()
    for proj in (m.q_proj, m.k_proj, m.v_proj, m.o_proj):
        assert proj.bias is None


# ---- the computation: chunks, skew, trimming ----------------------------------------------------


def test_skew_shifts_row_a_right_by_a():
    x = torch.arange(1, 1 + 3 * 4 * 5, dtype=torch.float64).view(3, 4, 5)  # (n, C, W)
    y = _skew(x)
    assert y.shape == (3, 4, 8)
    want = torch.zeros(3, 4, 8, dtype=torch.float64)
    for a in range(4):
        want[:, a, a : a + 5] = x[:, a]
    assert_close(y, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "cfg,p,tq,mem,padded",
    [
        (dict(max_span=48, ramp=8, trim_step=8), [0.1, 0.35], 37, 30, False),
        (dict(max_span=48, ramp=8, trim_step=8), [0.1, 0.35], 37, 30, True),
        (dict(max_span=48, ramp=8, trim_step=8), [0.9, 0.2], 37, 0, True),  # no memory
        (dict(max_span=100, ramp=4, trim_step=4), [0.05, 0.02], 40, 100, False),  # many chunks
        (dict(max_span=24, ramp=8, trim_step=64), [1.0, 0.5], 16, 8, True),  # window > segment
        (dict(max_span=48, ramp=8, trim_step=8, include_self=True), [0.2, 0.6], 19, 11, True),
        (dict(max_span=48, ramp=8, trim_step=8), [0.3, 0.3], 1, 50, False),  # one query
    ],
)
def test_forward_equals_the_full_matrix_definition(cfg, p, tq, mem, padded):
    """Chunked, trimmed, skewed forward == adaptive_span_reference (no trimming, no chunks, an
    explicit gather of key_pe per distance), full tensors, outputs and gradients."""
    m, pos = _part(p=p, **cfg)
    x, kv = _inputs(tq, mem)
    kp = None
    if padded:
        kp = torch.rand(2, mem + tq, generator=torch.Generator().manual_seed(3)) > 0.25
    mask = AttentionMask(causal=True, key_padding=kp)
    x1, kv1 = x.clone().requires_grad_(), kv.clone().requires_grad_()
    out = m(x1, kv=kv1, mask=mask, positions=pos).out
    (out * torch.cos(out)).sum().backward()
    grads = [x1.grad, kv1.grad, m.current_val.grad, pos.key_pe.grad, m.q_proj.weight.grad]
    m.zero_grad()
    pos.key_pe.grad = None
    x2, kv2 = x.clone().requires_grad_(), kv.clone().requires_grad_()
    q = m._heads(m.q_proj(x2))
    k, v = m._heads(m.k_proj(kv2)), m._heads(m.v_proj(kv2))
    o, _ = adaptive_span_reference(q, k, v, pos.key_pe, m.current_val, m.config, key_padding=kp)
    want = m.o_proj(o.transpose(1, 2).reshape(2, tq, -1))
    (want * torch.cos(want)).sum().backward()
    assert_close(out, want, rtol=1e-10, atol=1e-10)
    ref = [x2.grad, kv2.grad, m.current_val.grad, pos.key_pe.grad, m.q_proj.weight.grad]
    for a, b in zip(grads, ref):
        assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_trimmed_and_untrimmed_outputs_are_equal_and_trimming_drops_keys():
    cfg = dict(max_span=96, ramp=8, trim_step=8)
    p = [0.1, 0.26]  # z = 9.6, 24.96: reach 33 slots, window 40 of 96
    m, pos = _part(p=p, **cfg)
    full, _ = _part(p=p, trim=False, **cfg)
    full.load_state_dict(m.state_dict())
    assert m.window() == 40 and full.window() == 96
    x, kv = _inputs(tq=30, mem=96)
    seen = []
    hook = m.k_proj.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[1]))
    full.k_proj.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[1]))
    mask = AttentionMask(causal=True)
    a = m(x, kv=kv, mask=mask, positions=pos).out
    b = full(x, kv=kv, mask=mask, positions=pos).out
    hook.remove()
    assert_close(a, b, rtol=1e-12, atol=1e-12)
    # Keys the trimmed layer projects: the window before the first query and the segment
    # (minus the last position, no query sees it); untrimmed: all of them.
    assert seen == [40 + 30 - 1, 96 + 30 - 1]
    # float32 too (what training runs in).
    m32, full32 = m.float(), full.float()
    pos32 = SpanPositions(pos.key_pe.float())
    a = m32(x.float(), kv=kv.float(), mask=mask, positions=pos32).out
    b = full32(x.float(), kv=kv.float(), mask=mask, positions=pos32).out
    assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_window_and_reach_follow_the_official_rule():
    m, _ = _part(p=[0.0, 0.0], max_span=8192, ramp=32)
    assert m.reach() == 32 and m.window() == 64  # 8192 - floor64(8192 - 32)
    with torch.no_grad():
        m.current_val.copy_(torch.tensor([0.1, 0.05]))
    # ceil(819.2) + 32 = 852 slots, window 8192 - floor64(7340) = 896
    assert m.reach() == 852 and m.window() == 896
    assert m.memory_len(8192) == 896 + 64 and m.memory_len(500) == 500
    with torch.no_grad():
        m.current_val.fill_(1.0)
    assert m.window() == 8192 and m.memory_len(8192) == 8192
    no_cache, _ = _part(p=[0.0, 0.0], max_span=8192, adapt_cache=False)
    assert no_cache.memory_len(8192) == 8192


def test_chunk_choice_minimises_scored_pairs():
    assert _choose_chunk(512, 8192, 8703, 64) == 512  # 8 x 64 x 8255 saves only 5%
    assert _choose_chunk(512, 896, 1407, 64) == 64  # 8 x 64 x 959: 65% fewer than 512 x 1407
    assert _choose_chunk(1024, 1023, 1023, 64) == 1024  # full span over one segment: one chunk
    assert _choose_chunk(40, 5, 44, 4) == 4
    assert _choose_chunk(64, 64, 64, 64) == 64


def test_keys_beyond_the_reach_do_not_change_the_output():
    """Fidelity: a layer that were dense attention (or ignored the span) would see them."""
    m, pos = _part(p=[0.1, 0.2], max_span=64, ramp=8, trim_step=8)  # z + R = 14.4, 20.8
    x, kv = _inputs(tq=16, mem=40)
    mask = AttentionMask(causal=True)
    base = m(x, kv=kv, mask=mask, positions=pos).out
    far = kv.clone()
    far[:, :19] += 5.0  # distances >= 40 - 18 = 22 > z + R = 20.8 for every query
    assert_close(m(x, kv=far, mask=mask, positions=pos).out, base, rtol=0, atol=0)
    near = kv.clone()
    near[:, 38] += 5.0  # distance 2..17 from the queries
    assert not torch.allclose(m(x, kv=near, mask=mask, positions=pos).out, base)


# ---- penalty, clamp --------------------------------------------------------------------------


def test_penalty_is_lambda_s_mean_p_per_layer_in_aux_and_training_only():
    model = create_model(
        "adaptive-span-tiny",
        n_layers=3,
        attention={"max_span": 128, "ramp": 16, "penalty": 1e-3, "init_span": 0.25},
    )
    with torch.no_grad():
        model.blocks[1].attn.current_val.copy_(torch.tensor([0.5, 0.1]))
    ids = torch.randint(0, 256, (2, 32))
    out = model.train()(ids, targets=ids)
    assert sorted(out.aux) == [f"blocks.{i}.span_penalty" for i in range(3)]
    assert_close(out.aux["blocks.0.span_penalty"], torch.tensor(1e-3 * 128 * 0.25))
    assert_close(out.aux["blocks.1.span_penalty"], torch.tensor(1e-3 * 128 * 0.3))
    assert_close(out.total_loss, out.loss + sum(out.aux.values()))
    # d penalty / d p = lambda S / H per head.
    model.zero_grad()
    out.aux["blocks.2.span_penalty"].backward()
    assert_close(model.blocks[2].attn.current_val.grad, torch.full((2,), 1e-3 * 128 / 2))
    # Evaluation reports the task loss alone.
    ev = model.eval()(ids, targets=ids)
    assert ev.aux == {} and ev.total_loss is ev.loss


def test_after_optimizer_step_clamps_p_to_the_unit_interval():
    model = create_model("adaptive-span-tiny")
    with torch.no_grad():
        model.blocks[0].attn.current_val.copy_(torch.tensor([-0.3, 0.4]))
        model.blocks[1].attn.current_val.copy_(torch.tensor([1.7, 1.0]))
    after_optimizer_step(model)
    assert model.blocks[0].attn.current_val.tolist() == pytest.approx([0.0, 0.4])
    assert model.blocks[1].attn.current_val.tolist() == [1.0, 1.0]


def test_span_ratios_are_clipped_apart_from_the_task_weights():
    """The span ratios' gradient carries S / R; the trainer clips them as their own group, so a
    large span gradient no longer scales every other weight's step down (full tensors), and
    the trainer logs their norm as ``own_grad_norm``."""
    from effiformer.train import clip_gradients

    torch.manual_seed(0)
    model = create_model(
        "vanilla-tiny", seq_len=64, attention={"name": "adaptive_span", "max_span": 64, "ramp": 4}
    ).train()
    spans = [b.attn.current_val for b in model.blocks]
    assert [id(p) for p in model.blocks[0].attn.own_clip_parameters()] == [id(spans[0])]
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    model(ids, targets=ids).total_loss.backward()
    for p in spans:
        p.grad.mul_(1e4)  # as at T = 4,096 on tinyshakespeare: span norms up to 1e6-1e7
    own_ids = {id(p) for p in spans}
    task = [p for p in model.parameters() if id(p) not in own_ids]
    norm = lambda ps: float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ps])))  # noqa: E731
    n_task, n_own = norm(task), norm(spans)
    assert n_own > 100 * n_task > 0
    before = {id(p): p.grad.clone() for p in model.parameters()}
    got = clip_gradients(model, 1.0)
    assert got.task == pytest.approx(n_task, rel=1e-5) and got.own == pytest.approx(n_own, rel=1e-5)
    assert got.aux is None
    for ps, n in ((task, n_task), (spans, n_own)):
        scale = min(1.0, 1.0 / (n + 1e-6))
        for p in ps:
            assert_close(p.grad, before[id(p)] * scale)
    # one global norm would have scaled the task gradient by about 1 / n_own instead
    assert 1.0 / (n_task**2 + n_own**2) ** 0.5 < 0.01 * min(1.0, 1.0 / n_task)


def test_the_trainer_logs_the_span_group_norm(tmp_path):
    import json

    from effiformer.tasks.mqar import MQARTask

    torch.manual_seed(0)
    model = create_model(
        "vanilla-tiny", seq_len=64, attention={"name": "adaptive_span", "max_span": 64, "ramp": 4}
    )
    task = MQARTask(seq_len=64, batch_size=2, seed=0, eval_sequences=8)
    cfg = TrainConfig(steps=2, lr=1e-3, warmup=0, eval_every=None, progress=False, log_every=1,
                      out_dir=str(tmp_path))  # fmt: skip
    train(model, task, cfg)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "grad_norm" in r]
    assert len(steps) == 2 and all(r["own_grad_norm"] > 0 for r in steps)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    g = torch.Generator().manual_seed(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    lines = [
        " ".join(words[int(i)] for i in torch.randint(0, 8, (8,), generator=g)) for _ in range(400)
    ]
    path.write_text("\n".join(lines) + "\n")
    return read_text(path)


def test_p_stays_in_the_unit_interval_under_train(corpus, monkeypatch):
    """A strong penalty pushes p below 0 at the first step; the trainer's hook clamps it."""

    def run():
        torch.manual_seed(0)
        model = create_model(
            "adaptive-span-tiny", seq_len=16, mem_len=32, attention={"penalty": 1.0}
        )
        task = LMTask(corpus, batch_size=2, seq_len=16, seed=0, eval_tokens=64)
        cfg = TrainConfig(steps=3, lr=1e-2, warmup=0, eval_every=None, progress=False)
        train(model, task, cfg)
        return torch.cat([b.attn.current_val.detach() for b in model.blocks])

    p = run()
    assert ((p >= 0) & (p <= 1)).all() and (p == 0).any()
    monkeypatch.setattr(train_loop, "after_optimizer_step", lambda model: None)
    assert (run() < 0).any()  # without the hook p leaves [0, 1]


# ---- the span-sized cache ---------------------------------------------------------------------


def test_memory_keeps_the_span_sized_cache_per_layer_and_loses_nothing():
    torch.manual_seed(0)
    model = create_model("adaptive-span-tiny", n_layers=3).eval()
    with torch.no_grad():  # S = 128, R = 16, 16-key trimming
        model.blocks[0].attn.current_val.fill_(0.0)  # reach 16 -> window 16, cache 32
        model.blocks[1].attn.current_val.copy_(torch.tensor([0.3, 0.1]))  # 55 -> 64, 80
        model.blocks[2].attn.current_val.fill_(1.0)  # window 128, cache 128 (mem_len)
    lengths = [32, 80, 128]
    assert [b.attn.memory_len(128) for b in model.blocks] == lengths
    from effiformer.models.transformer_xl import reconfigure

    full = create_model("adaptive-span-tiny", n_layers=3, attention={"adapt_cache": False}).eval()
    full.load_state_dict(model.state_dict())
    ids = torch.randint(0, 256, (2, 6 * 32), generator=torch.Generator().manual_seed(1))
    state = full_state = None
    for seg in range(6):
        chunk = ids[:, seg * 32 : (seg + 1) * 32]
        out = model(chunk, state=state)
        ref = full(chunk, state=full_state)
        state, full_state = out.state, ref.state
        seen = (seg + 1) * 32
        assert [t.shape[1] for t in state] == [min(seen, n) for n in lengths]
        assert [t.shape[1] for t in full_state] == [min(seen, 128)] * 3
        # The shorter caches hold the newest states of the full one, and lose nothing.
        for a, b in zip(state, full_state):
            assert_close(a, b[:, b.shape[1] - a.shape[1] :], rtol=0, atol=0)
        assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    assert not any(t.requires_grad for t in state)
    assert reconfigure(model, mem_len=64).blocks[2].attn.memory_len(64) == 64


def test_works_in_the_dense_family_over_the_segment_only():
    torch.manual_seed(0)
    model = create_model(
        "vanilla-tiny",
        seq_len=64,
        attention={"name": "adaptive_span", "max_span": 48, "ramp": 8, "init_span": 0.2},
    ).eval()
    assert type(model.blocks[0].attn).__name__ == "AdaptiveSpanAttention"
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    a = model(ids).logits
    poked = ids.clone()
    poked[:, 40] = (poked[:, 40] + 1) % 256
    b = model(poked).logits
    assert_close(a[:, :40], b[:, :40], rtol=0, atol=0)  # causal
    assert not torch.allclose(a[:, 40:], b[:, 40:])
    with pytest.raises(ConfigError, match="causal"):
        create_model("vanilla-tiny", causal=False, attention={"name": "adaptive_span"})


# ---- spans move the right way ---------------------------------------------------------------


def _train_synthetic(target, *, n_layers, penalty, init, ramp, steps, lr, seed=0):
    torch.manual_seed(seed)
    model = create_model(
        "adaptive-span-tiny",
        n_layers=n_layers,
        vocab_size=16,
        mem_len=0,
        attention={
            "max_span": 64,
            "ramp": ramp,
            "init_span": init,
            "penalty": penalty,
            "trim_step": 16,
        },
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 16, (16, 32), generator=g)
        out = model(ids, targets=target(ids))
        opt.zero_grad()
        out.total_loss.backward()
        opt.step()
        after_optimizer_step(model)
    return torch.stack([b.attn.current_val.detach() for b in model.blocks]) * 64  # z


def test_spans_shrink_toward_the_ramp_with_a_large_penalty_on_a_local_task():
    """Targets are the current token: nothing to attend to. With lambda large every span
    collapses to z = 0 (reach R); without the penalty they stay where they started."""
    kw = dict(n_layers=1, init=0.5, ramp=16, steps=80, lr=1e-2)
    z = _train_synthetic(lambda ids: ids, penalty=1e-2, **kw)
    assert (z < 0.5).all(), z  # from 32 to ~0: the span is the ramp alone
    z0 = _train_synthetic(lambda ids: ids, penalty=0.0, **kw)
    assert (z0 > 20).all(), z0


def test_spans_grow_past_the_copy_distance():
    """Targets are the token d = 12 back. Every head starts with z = 0, reaching distances
    < R = 8 only; the widest head's reach z + R grows past d (a first hop through the other
    layer gives the gradient)."""
    d = 12

    def copy(ids):
        t = torch.full_like(ids, -100)
        t[:, d:] = ids[:, :-d]
        return t

    z = _train_synthetic(copy, n_layers=2, penalty=0.0, init=0.0, ramp=8, steps=200, lr=3e-3)
    assert float(z.max()) + 8 > d + 1, z


# ---- configuration, report -----------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_span", 0),
        ("ramp", 0),
        ("init_span", 1.5),
        ("init_span", -0.1),
        ("penalty", -1.0),
        ("trim_step", 0),
        ("eps", -1.0),
        ("trim", "yes"),
        ("key_pe_std", -1.0),
        ("key_pe_std", float("nan")),
    ],
)
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"attention.{field}"):
        AdaptiveSpanConfig(**{field: value})


def test_bad_inputs_get_clear_errors():
    m, pos = _part()
    x, _ = _inputs(4, 0)
    with pytest.raises(ValueError, match="causal"):
        m(x, mask=AttentionMask(causal=False), positions=pos)
    with pytest.raises(TypeError, match="SpanPositions"):
        m(x, mask=AttentionMask(causal=True), positions=None)
    with pytest.raises(ValueError, match="stateless"):
        m(x, mask=AttentionMask(causal=True), positions=pos, state=object())


def test_span_report_rows_table_and_plot(tmp_path):
    model = create_model("adaptive-span-tiny")
    with torch.no_grad():
        model.blocks[1].attn.current_val.copy_(torch.tensor([0.5, 0.25]))
    rows = span_report(model)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rows[2]["span"] == 64.0 and rows[3]["span"] == 32.0 and rows[2]["reach"] == 80.0
    assert rows[0]["window"] == 16 and rows[2]["window"] == 80 and rows[2]["memory"] == 96
    assert rows[0]["module"] == "blocks.0.attn"
    text = format_span_report(rows)
    assert "layer 1: 48.0" in text
    png = plot_span_report(rows, str(tmp_path / "spans.png"))
    assert (tmp_path / "spans.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png
