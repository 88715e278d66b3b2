"""The layer stack carries aux losses and buffer updates from any attention part to the model
output and the trainer, under per-layer names, in training only; it prepares once per forward;
per-layer memory lengths; activation recomputation is exact."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from effiformer import ConfigError, create_model
from effiformer.attention import AttentionConfig, AttentionMask, DenseAttention
from effiformer.attention.base import AttentionOutput
from effiformer.attention.registry import register_attention
from effiformer.config import parse_overrides
from effiformer.data import read_text
from effiformer.layers import FIFOMemory, LayerStack, TransformerBlock
from effiformer.layers.ffn import FeedForward
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, train


@dataclass(frozen=True, kw_only=True)
class CountingConfig(AttentionConfig):
    """Test-only: dense attention that returns an aux loss and a buffer update."""

    name = "test-counting"

    weight: float = 0.5


class CountingAttention(DenseAttention):
    """Counts its training forwards in a buffer (through ``updates``, never in place) and
    returns ``weight * ||W_q||^2`` as an aux loss. Counts prepare calls for the test."""

    prepared = 0

    @classmethod
    def from_config(cls, config, dims):
        m = cls(dims.dim, dims.n_heads, dims.head_dim)
        m.config, m.dims = config, dims
        m.register_buffer("calls", torch.zeros(()))
        return m

    def prepare(self, ctx, shared):
        type(self).prepared += 1
        return None

    def forward(self, x, *, kv=None, mask=None, state=None, positions=None) -> AttentionOutput:
        out = super().forward(x, kv=kv, mask=mask)
        if not self.training:
            return out
        out.aux = {"penalty": self.config.weight * (self.q_proj.weight**2).sum()}
        with torch.no_grad():
            out.updates = {"calls": self.calls + 1}
        return out


register_attention("test-counting", CountingConfig, CountingAttention)


def _text(tmp_path) -> str:
    p = tmp_path / "t.txt"
    p.write_text("to be or not to be that is the question\n" * 200)
    return str(p)


def test_aux_loss_reaches_the_output_and_total_loss_under_a_per_layer_name():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", attention={"name": "test-counting", "weight": 0.25})
    assert isinstance(model.blocks[0].attn, CountingAttention)
    ids = torch.randint(0, 256, (2, 16))
    out = model.train()(ids, targets=ids)
    assert sorted(out.aux) == ["blocks.0.penalty", "blocks.1.penalty"]
    for i in range(2):
        want = 0.25 * (model.blocks[i].attn.q_proj.weight ** 2).sum()
        assert_close(out.aux[f"blocks.{i}.penalty"], want)
    assert_close(out.total_loss, out.loss + sum(out.aux.values()))
    assert sorted(out.updates) == ["blocks.0.attn.calls", "blocks.1.attn.calls"]
    # eval: neither aux losses nor updates
    ev = model.eval()(ids, targets=ids)
    assert ev.aux == {} and ev.updates == {}
    assert_close(ev.total_loss, ev.loss)


def test_updates_reach_the_right_buffer_after_one_train_step_and_not_in_eval(tmp_path):
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", attention={"name": "test-counting"}, seq_len=16)
    task = LMTask(read_text(_text(tmp_path)), batch_size=4, seq_len=16)
    buffers = dict(model.named_buffers())
    assert {"blocks.0.attn.calls", "blocks.1.attn.calls"} <= set(buffers)
    hist = train(model, task, TrainConfig(steps=1, warmup=0, eval_every=None, progress=False))
    assert hist.step == 1 and "total_loss" in hist.train[0]
    for i in range(2):
        assert model.blocks[i].attn.calls.item() == 1.0  # applied once, after the step
    # the final evaluation ran in eval mode: it counted nothing
    task.evaluate(model, "valid")
    assert all(model.blocks[i].attn.calls.item() == 1.0 for i in range(2))


def test_prepare_runs_once_per_forward_for_a_group_of_equal_layers():
    model = create_model("vanilla-tiny", attention="test-counting", n_layers=3)
    CountingAttention.prepared = 0
    model(torch.randint(0, 256, (1, 8)))
    assert CountingAttention.prepared == 1


def test_attention_swaps_by_configuration_and_set_keys_are_validated():
    base = create_model("vanilla-tiny").config
    over = parse_overrides(base, ["attention.name=test-counting", "attention.weight=2"])
    assert over["attention"] == CountingConfig(weight=2.0)
    over = parse_overrides(base, ["attention.bias=false"])
    assert over["attention"].name == "dense" and over["attention"].bias is False
    with pytest.raises(
        ConfigError, match=r"unknown config key 'attention.weigth'.*attention.weight"
    ):
        parse_overrides(base, ["attention=test-counting", "attention.weigth=2"])
    with pytest.raises(ConfigError, match=r"unknown attention 'dens'.*\(closest first\): dense"):
        parse_overrides(base, ["attention.name=dens"])
    with pytest.raises(ConfigError, match="supports causal models only"):
        create_model("vanilla-tiny", attention="relative_xl", causal=False)
    m = create_model("vanilla-tiny", **{"attention.bias": False})
    assert m.blocks[0].attn.q_proj.bias is None


def _blocks(n, dim=16, seed=0):
    torch.manual_seed(seed)
    return [
        TransformerBlock(dim, DenseAttention(dim, 2, dim // 2), FeedForward(dim, 32), dropout=0.0)
        for _ in range(n)
    ]


def test_per_layer_memory_lengths():
    stack = LayerStack(_blocks(3), memory=FIFOMemory((2, 5, 0))).double()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    ctx_mask = AttentionMask(causal=True)
    from effiformer.attention import PrepareContext

    state = stack.init_state(1, 16, "cpu", torch.float64)
    for _ in range(3):
        ctx = PrepareContext(tq=4, tk=4, mask=ctx_mask, device=x.device, dtype=x.dtype)
        state = stack(x, mask=ctx_mask, ctx=ctx, state=state).state
    assert [s.shape[1] for s in state] == [2, 5, 0]


def test_recompute_gives_the_same_outputs_and_gradients_with_dropout_on():
    def run(recompute: bool) -> tuple[Tensor, list[Tensor]]:
        torch.manual_seed(0)
        m = create_model("vanilla-tiny", dropout=0.3, attn_dropout=0.2, recompute=recompute)
        m.train()
        ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(5)
        out = m(ids, targets=ids)
        out.loss.backward()
        return out.loss.detach(), [p.grad for p in m.parameters()]

    (la, ga), (lb, gb) = run(False), run(True)
    assert_close(la, lb, rtol=0, atol=0)
    for a, b in zip(ga, gb):
        assert_close(a, b, rtol=1e-6, atol=1e-7)
