"""effiformer's Funnel against HF transformers' with identical weights: a randomly initialised HF
model saved with ``save_pretrained`` and loaded through ``load_hf_funnel`` gives the same outputs
(full tensors), and a model saved back in HF layout loads into HF with the same outputs."""

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.reference

transformers = pytest.importorskip("transformers", reason="needs the 'reference' extra")

from effiformer.interop.hf_funnel import load_hf_funnel, save_hf_funnel  # noqa: E402
from effiformer.models.funnel import (  # noqa: E402
    FunnelForMaskedLM,
    FunnelForSequenceClassification,
    FunnelModel,
)


def _hf_config(**kw):
    base = dict(
        vocab_size=120,
        block_sizes=[1, 2, 1],
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=64,
        num_decoder_layers=2,
        num_labels=3,
    )
    base.update(kw)
    return transformers.FunnelConfig(**base)


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 120, (2, 19), generator=g)
    tt = torch.zeros_like(ids)
    tt[:, 10:] = 1
    tt[:, 0] = 2
    return ids, tt


def _out(o):
    return o.logits if getattr(o, "logits", None) is not None else o.last_hidden_state


def _mine(o):
    return o.logits if o.logits is not None else o.hidden


CASES = [
    ("FunnelModel", FunnelModel, {}),  # encoder + decoder
    ("FunnelBaseModel", FunnelModel, {}),  # encoder only
    ("FunnelForMaskedLM", FunnelForMaskedLM, {}),
    ("FunnelForSequenceClassification", FunnelForSequenceClassification, {}),
    ("FunnelModel", FunnelModel, {"attention_type": "factorized"}),
    ("FunnelModel", FunnelModel, {"pooling_type": "max", "block_repeats": [1, 1, 2]}),
    ("FunnelBaseModel", FunnelModel, {"separate_cls": False, "truncate_seq": False}),
]


@pytest.mark.parametrize("arch, cls, extra", CASES)
def test_hf_checkpoint_loads_with_identical_outputs(arch, cls, extra, tmp_path):
    torch.manual_seed(0)
    hf = getattr(transformers, arch)(_hf_config(**extra)).eval()
    hf.save_pretrained(tmp_path)
    mine = load_hf_funnel(tmp_path)
    assert type(mine) is cls
    if arch == "FunnelBaseModel":
        assert mine.decoder is None
    ids, tt = _inputs()
    with torch.no_grad():
        for kw in ({}, {"token_type_ids": tt}):
            want, got = _out(hf(ids, **kw)), _mine(mine(ids, **kw))
            assert want.shape == got.shape
            assert_close(got, want, rtol=1e-5, atol=1e-5)
    # float64 on both sides (HF still scores in float32, its "precision safe" cast, so the
    # agreement is bounded by float32 rounding of the scores)
    hf.double()
    mine.double()
    with torch.no_grad():
        assert_close(
            _mine(mine(ids, token_type_ids=tt)),
            _out(hf(ids, token_type_ids=tt)),
            rtol=1e-6,
            atol=1e-6,
        )


def test_loss_and_gradients_match_hf_for_masked_lm(tmp_path):
    torch.manual_seed(1)
    hf = transformers.FunnelForMaskedLM(_hf_config(hidden_dropout=0.0, attention_dropout=0.0))
    hf.save_pretrained(tmp_path)
    mine = load_hf_funnel(tmp_path).train()
    hf.train()
    ids, tt = _inputs()
    labels = torch.full_like(ids, -100)
    labels[:, 3::4] = ids[:, 3::4]
    a = hf(ids, token_type_ids=tt, labels=labels)
    b = mine(ids, token_type_ids=tt, targets=labels)
    assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-5)
    a.loss.backward()
    b.loss.backward()
    ga = hf.funnel.encoder.blocks[1][0].attention.r_kernel.grad
    gb = mine.funnel.encoder.blocks[1][0].attn.r_kernel.grad
    assert_close(gb, ga, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "arch", ["FunnelModel", "FunnelForMaskedLM", "FunnelForSequenceClassification"]
)
def test_save_back_round_trip(arch, tmp_path):
    torch.manual_seed(2)
    hf = getattr(transformers, arch)(_hf_config()).eval()
    hf.save_pretrained(tmp_path / "hf")
    mine = load_hf_funnel(tmp_path / "hf")
    save_hf_funnel(mine, tmp_path / "back")
    again = getattr(transformers, arch).from_pretrained(tmp_path / "back").eval()
    sd_a, sd_b = hf.state_dict(), again.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k
    ids, _ = _inputs()
    with torch.no_grad():
        assert_close(_out(again(ids)), _out(hf(ids)), rtol=0, atol=0)
    reloaded = load_hf_funnel(tmp_path / "back")
    with torch.no_grad():
        assert_close(_mine(reloaded(ids)), _mine(mine(ids)), rtol=0, atol=0)


def test_loader_rejects_mismatched_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    from effiformer.checkpoint import CheckpointError

    transformers.FunnelModel(_hf_config()).save_pretrained(tmp_path)
    w = load_file(str(tmp_path / "model.safetensors"))
    w.pop("encoder.blocks.1.0.attention.r_kernel")
    w["encoder.blocks.1.0.attention.extra"] = torch.zeros(1)
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="r_kernel"):
        load_hf_funnel(tmp_path)
