"""CUDA checks (marked ``gpu``; deselected by default, run with ``pytest -m gpu`` on a GPU machine).

Each compares the CUDA result with the CPU one computed from the same weights, so a kernel or
device-placement bug shows up as a mismatch, not just a crash.
"""

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model, list_models
from effiformer.attention import AttentionMask, DenseAttention

pytestmark = pytest.mark.gpu

TINY = [n for n in list_models("*-tiny")]


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device; run them with -m gpu on a GPU machine")


@pytest.mark.parametrize("causal", [False, True])
def test_dense_attention_cuda_matches_cpu(causal):
    torch.manual_seed(0)
    layer = DenseAttention(64, 4, 16).eval()
    x = torch.randn(2, 256, 64)
    kp = torch.ones(2, 256, dtype=torch.bool)
    kp[1, 200:] = False
    mask = AttentionMask(causal=causal, key_padding=kp)
    ref = layer.double()(x.double(), mask=mask).out
    got = (
        layer.float().cuda()(x.cuda(), mask=AttentionMask(causal=causal, key_padding=kp.cuda())).out
    )
    assert_close(got.cpu().double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_cuda_match_cpu(name):
    torch.manual_seed(0)
    model = create_model(name).eval()
    cfg = model.config
    x = torch.randint(0, cfg.vocab_size, (2, min(32, cfg.seq_len)))
    cpu = model(x, targets=x)
    gpu = model.cuda()(x.cuda(), targets=x.cuda())
    assert_close(gpu.loss.cpu(), cpu.loss, rtol=1e-4, atol=1e-4)
    if cpu.logits is not None:
        assert_close(gpu.logits.cpu(), cpu.logits, rtol=1e-3, atol=1e-3)


def test_bf16_autocast_training_step_on_cuda():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 16, (4, 33), device="cuda")
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x[:, :-1], targets=x[:, 1:])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_bench_on_cuda_reports_allocator_peak(tmp_path):
    from effiformer.bench import run_bench

    res = run_bench(
        ["vanilla-tiny"], lengths=[256], device="cuda", out=tmp_path, progress=False, repeats=2
    )
    ok = [r for r in res.records if r["status"] == "ok"]
    assert ok, res.records
    for r in ok:
        assert r["fwd_bwd_ms"] > 0 and r["peak_mib"] > 0
        assert "cuda" in r["memory_method"]
