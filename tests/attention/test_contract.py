"""The attention contract, checked for every registered mechanism (``list_attentions()``), so a
new mechanism is covered as soon as it registers:

- forward and backward run, with finite outputs and gradients;
- causal use: changing future tokens leaves earlier outputs unchanged, exactly (under the
  part's ``causal_config``; a part causal in its weights only, such as LSH, returns ``None``,
  is left out of this check and tests its weights itself);
- padded keys do not change the outputs at real positions;
- the mechanism's degenerate configuration equals dense attention with its own projections
  (full tensors, float64), and its default configuration differs from it;
- its config round-trips through a checkpoint of a model that uses it.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model, load_model, save_model
from effiformer.attention import AttentionDims, AttentionMask, PrepareContext
from effiformer.attention.registry import get_attention, list_attentions

T, B, D, H = 64, 2, 32, 2

BUILTIN = [
    n for n in list_attentions() if get_attention(n).module_cls.__module__.startswith("effiformer.")
]
CASES = [(n, m) for n in BUILTIN for m in get_attention(n).modes]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _build(
    name: str, mode: str, *, degenerate: bool = False, dtype=torch.float64, seed=0, config=None
):
    spec = get_attention(name)
    dims = AttentionDims(D, H, D // H, causal=mode == "causal", layer=0, n_layers=2, max_len=T)
    if config is None:
        config = spec.module_cls.example_config(spec.config_cls(), T)
    if degenerate:
        config = spec.module_cls.degenerate_config(config, T)
    torch.manual_seed(seed)
    m = spec.module_cls.from_config(config, dims).to(dtype)
    shared = spec.module_cls.build_shared(config, dims)
    if shared is not None:
        shared = shared.to(dtype)
    if degenerate:
        m.make_dense_equivalent_()
        if hasattr(shared, "make_dense_equivalent_"):
            shared.make_dense_equivalent_()
    return m.eval(), shared


def _run(m, shared, x, mask, generator_seed=0):
    ctx = PrepareContext(
        tq=x.shape[1],
        tk=x.shape[1],
        mask=mask,
        device=x.device,
        dtype=x.dtype,
        training=m.training,
        generator=torch.Generator().manual_seed(generator_seed),
    )
    return m(x, mask=mask, positions=m.prepare(ctx, shared)).out


def _x(seed=0, dtype=torch.float64):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("name,mode", CASES)
def test_forward_and_backward_run(name, mode):
    m, shared = _build(name, mode, dtype=torch.float32)
    m.train()
    x = _x(dtype=torch.float32).requires_grad_()
    out = _run(m, shared, x, AttentionMask(causal=mode == "causal"))
    assert out.shape == (B, T, D) and torch.isfinite(out).all()
    (out**2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    params = list(m.parameters()) + ([] if shared is None else list(shared.parameters()))
    got = [p for p in params if p.grad is not None]
    assert got, "no parameter received a gradient"
    assert all(torch.isfinite(p.grad).all() for p in got)


def _causal_config(name):
    cls = get_attention(name).module_cls
    return cls.causal_config(cls.example_config(get_attention(name).config_cls(), T), T)


EXACTLY_CAUSAL = [
    n for n in BUILTIN if "causal" in get_attention(n).modes and _causal_config(n) is not None
]


@pytest.mark.parametrize("name", BUILTIN)
def test_own_clip_parameters_are_the_parts_own_trainable_parameters(name):
    """What a part asks the trainer to clip apart (``own_clip_parameters``) is a subset of its
    own trainable parameters, each once: the trainer's groups then partition the model."""
    mode = get_attention(name).modes[0]
    m, _ = _build(name, mode, dtype=torch.float32)
    own = m.own_clip_parameters()
    mine = {id(p) for p in m.parameters()}
    assert len({id(p) for p in own}) == len(own)
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad and id(p) in mine for p in own)
    assert bool(own) == (name == "adaptive_span")  # the one part whose gradient scale is its own


def test_exactly_causal_list_leaves_out_only_weight_causal_parts():
    left_out = {n for n in BUILTIN if "causal" in get_attention(n).modes} - set(EXACTLY_CAUSAL)
    assert left_out <= {"lsh", "pattern"}, left_out
    assert "dense" in EXACTLY_CAUSAL and "local" in EXACTLY_CAUSAL


@pytest.mark.parametrize("name", EXACTLY_CAUSAL)
def test_causal_outputs_ignore_future_tokens_exactly(name):
    m, shared = _build(name, "causal", config=_causal_config(name))
    mask = AttentionMask(causal=True)
    x = _x()
    base = _run(m, shared, x, mask)
    for t0 in (1, T // 2 + 3, T - 1):
        x2 = x.clone()
        x2[:, t0:] = torch.randn(B, T - t0, D, dtype=x.dtype)
        out = _run(m, shared, x2, mask)
        assert_close(out[:, :t0], base[:, :t0], rtol=0, atol=0)
        assert not torch.allclose(out[:, t0:], base[:, t0:])


@pytest.mark.parametrize("name,mode", CASES)
def test_padded_keys_do_not_change_real_outputs(name, mode):
    m, shared = _build(name, mode)
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, T - 5 :] = False
    real[1, T - 17 :] = False
    mask = AttentionMask(causal=mode == "causal", key_padding=real)
    x = _x()
    base = _run(m, shared, x, mask)
    x2 = x.clone()
    x2[~real] = torch.randn(int((~real).sum()), D, dtype=x.dtype) * 3
    out = _run(m, shared, x2, mask)
    assert_close(out[real], base[real], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,mode", CASES)
def test_degenerate_configuration_equals_dense_attention(name, mode):
    m, shared = _build(name, mode, degenerate=True)
    for padded in (False, True):
        real = torch.ones(B, T, dtype=torch.bool)
        if padded:
            real[1, T - 9 :] = False
        mask = AttentionMask(causal=mode == "causal", key_padding=real if padded else None)
        x = _x(seed=1)
        out = _run(m, shared, x, mask)
        want = m.dense_reference(x, mask=mask)
        assert_close(out[real], want[real], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name,mode", [c for c in CASES if c[0] != "dense"])
def test_default_configuration_differs_from_dense(name, mode):
    m, shared = _build(name, mode)
    mask = AttentionMask(causal=mode == "causal")
    x = _x(seed=2)
    assert not torch.allclose(_run(m, shared, x, mask), m.dense_reference(x, mask=mask), atol=1e-6)


@pytest.mark.parametrize("name,mode", CASES)
def test_config_round_trips_through_a_checkpoint(name, mode, tmp_path):
    spec = get_attention(name)
    config = spec.module_cls.example_config(spec.config_cls(), T)
    torch.manual_seed(0)
    model = create_model(
        "vanilla-tiny", attention=config, causal=mode == "causal", seq_len=T, dropout=0.0
    ).eval()
    assert model.config.attention == config
    save_model(model, tmp_path / "ck")
    loaded = load_model(tmp_path / "ck").eval()
    assert loaded.config == model.config and loaded.config.attention == config
    ids = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    a = model(ids).logits
    torch.manual_seed(1)
    b = loaded(ids).logits
    assert_close(a, b, rtol=0, atol=0)
