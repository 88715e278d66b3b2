"""benchmarks/routing_routed_head.py: zeroing a head type at evaluation is the model built with
that head type's output muted, the shares are what they say, and the script records a smoke
quality run's routing LM cell (tiny sizes, fixed steps: nothing here is timed)."""

import dataclasses
import json

import pytest
import torch
from torch.testing import assert_close

from effiformer import get_config
from effiformer.attention.routing import RoutingAttention
from effiformer.bench.quality import run_quality
from effiformer.registry import build_model


def _routing_lm(**attention):
    torch.manual_seed(0)
    cfg = get_config("vanilla-tiny", vocab_size=32, seq_len=32, dim=32, n_heads=2, ffn_dim=64,
                     attention={"name": "routing", "window": 8, "clusters": 4, **attention})  # fmt: skip
    return build_model(cfg).double().eval()


def test_zeroing_the_routed_heads_is_the_muted_model_and_shares_follow(bench_script):
    script = bench_script("routing_routed_head")
    model, muted = _routing_lm(), _routing_lm(mute_routed=True)
    muted.load_state_dict(model.state_dict())
    x = torch.randint(0, 32, (2, 32))
    with torch.no_grad():
        plain = model(x).logits
        with script.Zeroed(model, "routed"):
            zeroed = model(x).logits
        assert_close(zeroed, muted(x).logits, rtol=1e-12, atol=1e-12)
        assert (plain - zeroed).abs().max() > 1e-3
        assert_close(model(x).logits, plain, rtol=0, atol=0)  # the hooks are gone on exit
        with script.Zeroed(model, "local"):
            no_local = model(x).logits
        assert (no_local - plain).abs().max() > 1e-3 and (no_local - zeroed).abs().max() > 1e-3
    shares = script.output_shares(model, x)
    n_layers = sum(isinstance(m, RoutingAttention) for m in model.modules())
    assert len(shares) == n_layers == 2 and all(0.05 < s < 0.95 for s in shares)
    assert script.output_shares(muted, x) == [0.0] * n_layers
    # balanced routing: 4 centroids x w = 8 slots for 32 tokens, so a token some centroids
    # share leaves another unchosen; muted, every routed output is zero
    assert all(0 < u < 1 for u in script.unrouted(model, x))
    assert script.unrouted(muted, x) == [1.0] * n_layers
    with pytest.raises(ValueError, match="which"):
        script.Zeroed(model, "both")


def test_script_scores_a_smoke_routing_lm_cell(tmp_path, shared_data, bench_script, capsys):
    shared_data("ptb")
    script = bench_script("routing_routed_head")
    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        run_quality(["lm-ptb"], ["routing"], budget="smoke", out=out, data=shared_data.root,
                    progress=False)  # fmt: skip
        cell = "lm-ptb/routing/T64/lr0.003/s0"
        argv = ["--out", str(out), "--data", str(shared_data.root), "--eval-tokens", "2048"]
        # a cell with no record, or not a language-modelling cell, is one line and exit 2
        assert script.main([*argv, "--cells", "lm-ptb/nothing/T64/lr0.003/s0"]) == 2
        with pytest.raises(SystemExit):  # argparse: "--sequences: ... must be a positive integer"
            script.main([*argv, "--cells", cell, "--sequences", "0"])
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps({"cell": "mqar/routing/T64/lr0.003/s0", "task": "mqar"}) + "\n")
        fake = out / "cells" / "mqar_routing_T64_lr0.003_s0"  # a checkpoint, so the task decides
        fake.mkdir(parents=True)
        (fake / "latest").write_text("step-00000001\n")
        capsys.readouterr()
        assert script.main([*argv, "--cells", "mqar/routing/T64/lr0.003/s0"]) == 2
        assert "is not a language-modelling cell" in capsys.readouterr().err
        assert not (out / "routed_head.jsonl").exists()  # nothing written on a refusal
        assert script.main([*argv, "--cells", cell]) == 0
    finally:
        torch.set_num_threads(threads)
    (row,) = [json.loads(x) for x in (out / "routed_head.jsonl").read_text().splitlines()]
    assert row["cell"] == cell and row["eval_tokens"] == 2048
    assert row["valid"] != row["valid_routed_zeroed"] and row["valid"] != row["valid_local_zeroed"]
    assert len(row["routed_share"]) == 1 and 0 < row["routed_share"][0] < 1
    assert len(row["unrouted"]) == 1 and 0 <= row["unrouted"][0] < 1
    assert len(row["init_unrouted"]) == 1 and 0 < row["init_routed_share"][0] < 1
    assert row["init_routed_share"] != row["routed_share"]  # trained weights differ from init
    assert (out / "routed_head.md").read_text().count("\n") == 3


def test_zeroed_leaves_a_model_without_routing_alone(bench_script):
    script = bench_script("routing_routed_head")
    torch.manual_seed(0)
    dense = build_model(dataclasses.replace(get_config("vanilla-tiny"), vocab_size=16))
    assert script.Zeroed(dense, "routed").layers == []
