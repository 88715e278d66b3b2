"""Adaptive input and adaptive softmax: a normalised distribution, the plain-softmax limit, ties."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from effiformer.layers.adaptive import AdaptiveInput, AdaptiveLogSoftmax

V, CUT = 50, (10, 20, 35)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny ops: one intra-op thread is ~100x faster than two on a loaded shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _pair(div_val: int, embed_dim: int, dim: int, cutoffs=CUT, tie_projs=True):
    torch.manual_seed(0)
    emb = AdaptiveInput(V, embed_dim, dim, cutoffs=cutoffs, div_val=div_val).double()
    sm = AdaptiveLogSoftmax(
        V, embed_dim, dim, cutoffs=cutoffs, div_val=div_val, tie_to=emb, tie_projs=tie_projs
    ).double()
    with torch.no_grad():  # non-trivial biases so every term of the head/tails is exercised
        sm.bias.normal_()
        if sm.cluster_bias is not None:
            sm.cluster_bias.normal_()
    return emb, sm


@pytest.mark.parametrize("div_val,embed_dim,dim", [(1, 16, 16), (1, 8, 16), (2, 16, 16)])
def test_log_probs_normalise_and_nll_matches(div_val, embed_dim, dim):
    _, sm = _pair(div_val, embed_dim, dim)
    h = torch.randn(13, dim, dtype=torch.float64)
    lp = sm.log_prob(h)  # (13, V)
    assert lp.shape == (13, V)
    assert_close(torch.logsumexp(lp, -1), torch.zeros(13, dtype=torch.float64))
    target = torch.tensor([0, 9, 10, 19, 20, 34, 35, 49, 3, 12, 22, 40, 5])
    assert_close(sm.nll(h, target), -lp.gather(1, target[:, None]).squeeze(1))
    # hierarchical definition: p(w) = p(cluster | h) p(w | cluster, h), checked for one tail word
    w, b, proj = sm._cluster(2)
    head = torch.cat([sm._cluster(0)[0], sm.cluster_weight])
    hh = h if sm._cluster(0)[2] is None else h @ sm._cluster(0)[2]
    head_lp = F.log_softmax(hh @ head.T + torch.cat([sm._cluster(0)[1], sm.cluster_bias]), -1)
    ht = h if proj is None else h @ proj
    tail_lp = F.log_softmax(ht @ w.T + b, -1)
    assert_close(lp[:, 25], head_lp[:, 10 + 1] + tail_lp[:, 25 - 20])


def test_no_cutoffs_div_val_1_is_a_plain_tied_softmax():
    emb, sm = _pair(1, 16, 16, cutoffs=())
    h = torch.randn(7, 16, dtype=torch.float64)
    want = F.log_softmax(h @ emb.emb_layers[0].weight.T + sm.bias, -1)
    assert_close(sm.log_prob(h), want)
    assert_close(F.log_softmax(sm.logits(h), -1), want)
    ids = torch.tensor([[0, 5, 49]])
    assert_close(emb(ids), emb.emb_layers[0].weight[ids] * 16**0.5)


def test_adaptive_input_embeds_each_cluster_through_its_projection():
    emb, _ = _pair(2, 16, 12)
    ids = torch.tensor([[0, 9, 10, 25, 49]])
    out = emb(ids)  # (1, 5, 12)
    bounds = [0, *CUT, V]
    for t, tok in enumerate(ids[0].tolist()):
        i = max(k for k in range(4) if bounds[k] <= tok)
        want = emb.emb_layers[i].weight[tok - bounds[i]] @ emb.projs[i].T * 12**0.5
        assert_close(out[0, t], want)
    assert [e.weight.shape[1] for e in emb.emb_layers] == [16, 8, 4, 2]


def test_tied_weights_and_projections_are_shared():
    emb, sm = _pair(2, 16, 16)
    for i in range(4):
        assert sm.weights[i] is emb.emb_layers[i].weight
    assert sm.projs[0] is not emb.projs[0]  # head projection untied (official tie_projs[0])
    for i in range(1, 4):
        assert sm.projs[i] is emb.projs[i]
    # a gradient step through the softmax moves the input embedding of the same token
    before = emb.emb_layers[2].weight.detach().clone()
    h = torch.randn(3, 16, dtype=torch.float64)
    sm.nll(h, torch.tensor([25, 26, 30])).sum().backward()
    with torch.no_grad():
        for p in sm.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert not torch.equal(emb.emb_layers[2].weight, before)
    untied = AdaptiveLogSoftmax(V, 16, 16, cutoffs=CUT, div_val=2, tie_to=emb, tie_projs=False)
    assert all(untied.projs[i] is not emb.projs[i] for i in range(4))


def test_bad_arguments():
    with pytest.raises(ValueError, match="cutoffs"):
        AdaptiveInput(V, 16, 16, cutoffs=(20, 10))
    with pytest.raises(ValueError, match="div_val"):
        AdaptiveInput(V, 4, 16, cutoffs=CUT, div_val=4)
    _, sm = _pair(1, 16, 16)
    with pytest.raises(ValueError, match="target ids"):
        sm.nll(torch.randn(2, 16, dtype=torch.float64), torch.tensor([0, V]))
    with pytest.raises(ValueError, match="hidden"):
        sm.log_prob(torch.randn(2, 3, 16))
