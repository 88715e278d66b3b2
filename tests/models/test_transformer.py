"""The dense baseline: causal LM, bidirectional encoder, positions, input checks."""

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model


def test_causal_lm_ignores_future_tokens():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny").eval()
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[:, 8:] = (y[:, 8:] + 1) % 256
    a, b = model(x).logits, model(y).logits
    assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_encoder_sees_both_directions():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", causal=False).eval()
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 256
    assert not torch.allclose(model(x).logits[:, 0], model(y).logits[:, 0])


def test_encoder_padding_is_ignored():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", causal=False).eval()
    x = torch.randint(0, 256, (1, 10))
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[:, 7:] = False
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 5) % 256
    a = model(x, attention_mask=mask).logits
    b = model(y, attention_mask=mask).logits
    assert_close(a[:, :7], b[:, :7])


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_variants_train(positions, norm_first):
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", positions=positions, norm_first=norm_first)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 16, (4, 32))
    losses = []
    for _ in range(30):
        out = model(x[:, :-1], targets=x[:, 1:])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_positions_matter():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", causal=False).eval()
    x = torch.tensor([[1, 2, 3, 4]])
    a = model(x).logits
    b = model(x.flip(1)).logits.flip(1)
    assert not torch.allclose(a, b)


def test_bad_inputs_name_the_problem():
    model = create_model("vanilla-tiny")
    with pytest.raises(ValueError, match="token id 256 is outside the vocabulary"):
        model(torch.tensor([[1, 256]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="exceeds the model's limit seq_len=128"):
        model(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\(batch, seq_len\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must have the shape"):
        model(torch.zeros(1, 4, dtype=torch.long), targets=torch.zeros(1, 3, dtype=torch.long))


def test_scored_only_gives_the_full_heads_loss_and_logits_at_the_scored_positions():
    """``scored_only`` runs the head at the scored positions only: the same loss (and gradient)
    as the full head, and logits equal to the full logits at those positions, row-major."""
    from effiformer import create_model

    torch.manual_seed(0)
    model = create_model("vanilla-tiny", vocab_size=512)
    assert model.scores_subset
    x = torch.randint(0, 512, (3, 40))
    y = torch.full_like(x, -100)
    y[0, 5], y[0, 30], y[2, 7] = 11, 12, 13
    full = model(x, targets=y)
    full.loss.backward()
    g_full = model.embed.weight.grad.clone()
    model.zero_grad()
    part = model(x, targets=y, scored_only=True)
    part.loss.backward()
    assert part.logits.shape == (3, 512)
    keep = y != -100
    torch.testing.assert_close(part.logits, full.logits[keep])
    torch.testing.assert_close(part.loss, full.loss)
    torch.testing.assert_close(model.embed.weight.grad, g_full)
    with pytest.raises(ValueError, match="scored_only=True needs targets"):
        model(x, scored_only=True)


def test_without_positions_an_encoder_is_permutation_equivariant():
    """positions="none": nothing but attention carries order, so a bidirectional dense model
    maps a permuted input to the permuted output (learned positions break it, above)."""
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", causal=False, positions="none").double().eval()
    assert not any(n.startswith("pos.") for n, _ in model.named_parameters())
    x = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(2))
    assert_close(model(x[:, perm]).logits, model(x).logits[:, perm], rtol=1e-12, atol=1e-12)


def test_the_routing_input_pipeline_options():
    """token_dropout replaces input tokens (training only; the targets stay), embed_dropout
    drops embeddings before embed_dense's projection, norm_eps reaches every LayerNorm."""
    torch.manual_seed(0)
    model = create_model(
        "vanilla-tiny", token_dropout=0.5, token_dropout_id=7, embed_dropout=0.3,
        embed_dense=True, norm_eps=1e-6,
    )  # fmt: skip
    assert isinstance(model.embed_proj, torch.nn.Linear) and model.embed_proj.bias is not None
    assert model.embed_drop.p == 0.3
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.eps == 1e-6 for m in norms)
    seen = []
    model.embed.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].clone()))
    x = torch.randint(8, 256, (8, 64), generator=torch.Generator().manual_seed(3))
    model.train()(x, targets=x)
    dropped = seen[-1] == 7
    assert 0.4 < dropped.float().mean() < 0.6  # about half, every one replaced by the id
    assert torch.equal(seen[-1][~dropped], x[~dropped])
    model.eval()(x)
    assert torch.equal(seen[-1], x)  # never at evaluation
    with pytest.raises(ValueError, match="token_dropout must be in"):
        create_model("vanilla-tiny", token_dropout=1.0)
    with pytest.raises(ValueError, match="token_dropout_id must be a token id"):
        create_model("vanilla-tiny", token_dropout_id=256)
