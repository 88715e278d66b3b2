"""The bench rows with spans set by hand: what they build, and that the counted compute falls
with the spans (FLOPs, not time: nothing here is timed)."""

import pytest
import torch

from effiformer import get_config
from effiformer.bench import adaptive_span_references as refs
from effiformer.bench.cell import count_flops
from effiformer.bench.references import CellSpec, references_for


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _spec(part, span=2048, seq_len=128):
    """The paper's base model narrowed (1 layer, d 64) with S = 2048 and blocks of 128 (the
    base model's S / block ratio is 16)."""
    config = get_config(
        "adaptive-span-base", n_layers=1, dim=64, embed_dim=64, n_heads=2, ffn_dim=256, dropout=0.0,
        attn_dropout=0.0, seq_len=seq_len, mem_len=span, attention={"max_span": span},
    )  # fmt: skip
    return CellSpec(
        name="adaptive-span-base", config=config, part=part, seq_len=seq_len, batch=1,
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip


def test_rows_stand_beside_every_adaptive_span_name():
    for part in ("model", "attention"):
        names = {r.name for r in references_for("adaptive-span-small", "xl", part)}
        assert set(refs.FRACTIONS) <= names
    assert not any(r.name in refs.FRACTIONS for r in references_for("xl-small", "xl", "model"))


def test_set_spans_and_the_model_row_runs_against_full_memories():
    wl = refs.span_workload(_spec("model", span=8192, seq_len=16), 0.1)
    blocks = list(wl.module.blocks)
    assert all(float(b.attn.current_val.detach().min()) == pytest.approx(0.1) for b in blocks)
    assert blocks[0].attn.memory_len(8192) == 960  # window 896 + 64
    loss = wl.forward()
    assert loss.dim() == 0 and torch.isfinite(loss)
    with pytest.raises(ValueError, match="adaptive_span"):
        refs.set_spans_(torch.nn.Linear(2, 2), 0.5)


@pytest.mark.parametrize("part", ["attention", "model"])
def test_spans_at_a_tenth_of_s_cost_over_3x_fewer_flops_than_spans_at_s(part):
    """With every span at 0.1 S (z = 204.8) the window is 256 keys and the cache 320 states,
    against 2048 of each at S."""
    torch.manual_seed(0)
    tenth = count_flops(refs.span_workload(_spec(part), 0.1))
    full = count_flops(refs.span_workload(_spec(part), 1.0))
    assert full[1] / tenth[1] > 3.0, (full, tenth)  # forward + backward
