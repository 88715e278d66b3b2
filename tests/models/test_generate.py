"""``model.generate``: every causal LM family samples through one API; the dense KV cache equals
recomputation; sampling filters do what they say; bidirectional models are refused."""

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model
from effiformer.sampling import sample_next


def _greedy_by_recompute(model, prompt, n):
    ids = prompt
    for _ in range(n):
        nxt = model(ids[:, -model.config.seq_len :]).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


def test_dense_kv_cache_decoding_equals_recomputation_within_the_window():
    torch.manual_seed(0)
    m = create_model("vanilla-tiny", seq_len=32).double().eval()
    prompt = torch.randint(0, 256, (2, 5))
    state = m.init_decoding_state(2)
    assert len(state) == 2 and state[0].length == 0
    full = m(torch.cat([prompt, prompt[:, :3]], 1)).logits
    out = m(prompt, state=state)
    step = m(prompt[:, :3], state=out.state)
    assert step.state[0].length == 8
    assert_close(torch.cat([out.logits, step.logits], 1), full, rtol=1e-10, atol=1e-10)
    assert torch.equal(m.generate(prompt, 20, temperature=0), _greedy_by_recompute(m, prompt, 20))


def test_dense_generation_beyond_seq_len_rebuilds_the_cache():
    torch.manual_seed(0)
    m = create_model("vanilla-tiny", seq_len=16).eval()
    ids = m.generate(torch.randint(0, 256, (1, 10)), 40, temperature=0)
    assert ids.shape == (1, 50)
    with pytest.raises(ValueError, match="exceed seq_len"):
        m(
            torch.zeros(1, 4, dtype=torch.long),
            state=m(torch.zeros(1, 14, dtype=torch.long), state=m.init_decoding_state(1)).state,
        )


@pytest.mark.parametrize("name", ["vanilla-tiny", "xl-tiny", "compressive-tiny"])
def test_every_causal_family_generates_and_restores_its_mode(name):
    torch.manual_seed(0)
    m = create_model(name).train()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (2, 7), generator=g)
    a = m.generate(
        prompt, 12, temperature=0.8, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(1)
    )
    b = m.generate(
        prompt, 12, temperature=0.8, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(1)
    )
    assert a.shape == (2, 19) and torch.equal(a[:, :7], prompt) and torch.equal(a, b)
    assert m.training


def test_bidirectional_models_and_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="bidirectional"):
        create_model("funnel-tiny").generate(torch.zeros(1, 3, dtype=torch.long), 2)
    m = create_model("vanilla-tiny")
    with pytest.raises(ValueError, match="top_p"):
        m.generate(torch.zeros(1, 3, dtype=torch.long), 2, top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(torch.zeros(1, 3, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.generate(torch.full((1, 3), 999), 2)


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen_k = {int(sample_next(logits, top_k=2, generator=g)) for _ in range(200)}
    seen_p = {int(sample_next(logits, top_p=0.8, generator=g)) for _ in range(200)}
    seen_p2 = {int(sample_next(logits, top_p=0.81, generator=g)) for _ in range(300)}
    assert seen_k == {0, 1} and seen_p == {0, 1} and seen_p2 == {0, 1, 2}
    assert int(sample_next(logits, temperature=0)) == 0


@pytest.mark.parametrize("name", ["vanilla-tiny", "xl-tiny", "funnel-tiny"])
def test_an_empty_input_gets_a_named_error(name):
    with pytest.raises(ValueError, match="input_ids is empty"):
        create_model(name)(torch.zeros(1, 0, dtype=torch.long))
