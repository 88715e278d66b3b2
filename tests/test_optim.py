"""AdagradParamClip (Adaptive Span's optimiser) and its recipe."""

import torch
from torch import nn
from torch.testing import assert_close

from effiformer import create_model
from effiformer.optim import AdagradParamClip
from effiformer.recipes import ADAPTIVE_SPAN_RECIPE, describe_training, recipe_for
from effiformer.train import TrainConfig, make_optimizer


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(4, 3, generator=g, dtype=torch.float64)) for _ in range(2)]


def test_equals_torch_adagrad_when_no_gradient_exceeds_the_threshold():
    ours, ref = _params(), _params()
    opt = AdagradParamClip(ours, lr=0.1, eps=1e-10, clip=1e6)
    ref_opt = torch.optim.Adagrad(ref, lr=0.1, eps=1e-10)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in ours]
        for p, q, gr in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref, strict=True):
        assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_large_gradients_shrink_that_tensors_step_only_and_the_accumulator_stays_raw():
    (p, q), lr, clip = _params(), 0.07, 0.03
    p0, q0 = p.detach().clone(), q.detach().clone()
    gp = torch.full((4, 3), 2.0, dtype=torch.float64)  # norm sqrt(12) * 2 = 6.93 > clip
    gq = torch.full((4, 3), 0.001, dtype=torch.float64)  # norm 0.0035 < clip
    opt = AdagradParamClip([p, q], lr=lr, eps=0.0, clip=clip)
    for step in (1, 2):
        p.grad, q.grad = gp.clone(), gq.clone()
        opt.step()
        # by hand: sum = step * g^2 (the raw gradient), lr shrunk by clip / ||g|| for p only
        scale_p = clip / (float(gp.norm()) + 1e-10)
        p0 = p0 - lr * scale_p * gp / (step * gp**2).sqrt()
        q0 = q0 - lr * gq / (step * gq**2).sqrt()
        assert_close(p.detach(), p0, rtol=1e-12, atol=1e-12)
        assert_close(q.detach(), q0, rtol=1e-12, atol=1e-12)
        assert_close(opt.state[p]["sum"], step * gp**2, rtol=0, atol=0)
    # global-norm clipping would have shrunk q's step too (the joint norm is p's); here q moved
    # by plain Adagrad's full step, lr per element on the first step
    assert_close((q.detach() - _params()[1].detach()).abs().max().item(), lr * (1 + 2**-0.5))


def test_adaptive_span_models_take_the_papers_recipe_and_the_trainer_builds_it():
    assert recipe_for("adaptive-span-tiny", "xl") is ADAPTIVE_SPAN_RECIPE
    r = ADAPTIVE_SPAN_RECIPE
    assert (r.optimizer, r.lr, r.clip, r.warmup, r.schedule) == (
        "adagrad-clip",
        0.07,
        0.03,
        32_000,
        "constant",
    )
    assert "per-parameter step clip 0.03" in describe_training(r.values())
    model = create_model("adaptive-span-tiny")
    opt = make_optimizer(model, TrainConfig(steps=10, **r.values()))
    assert isinstance(opt, AdagradParamClip)
    assert all(g["clip"] == 0.03 for g in opt.param_groups)
    # the xl family itself keeps Transformer-XL's recipe
    assert recipe_for("xl-tiny", "xl").name == "xl"


def test_each_adaptive_span_size_takes_its_own_scripts_recipe():
    """Issue 23: the official small, base and large scripts differ (warmup 8,000 and 150,000
    steps; 32,000 and 600,000; 32,000 and 150,000 then 20,000 at lr 0.007)."""
    from effiformer.recipes import ADAPTIVE_SPAN_LARGE_RECIPE, ADAPTIVE_SPAN_SMALL_RECIPE

    small, base = recipe_for("adaptive-span-small", "xl"), recipe_for("adaptive-span-base", "xl")
    large = recipe_for("adaptive-span-large", "xl")
    assert small is ADAPTIVE_SPAN_SMALL_RECIPE and large is ADAPTIVE_SPAN_LARGE_RECIPE
    assert base is ADAPTIVE_SPAN_RECIPE
    assert [(r.warmup, r.steps) for r in (small, base, large)] == [
        (8_000, 150_000), (32_000, 600_000), (32_000, 150_000)
    ]  # fmt: skip
    for r in (small, base, large):  # the optimiser is the same in every script
        assert (r.optimizer, r.lr, r.clip, r.schedule) == ("adagrad-clip", 0.07, 0.03, "constant")
    assert "--lr 0.007 --steps 170000" in large.notes
