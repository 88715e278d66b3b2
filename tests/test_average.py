"""``effiformer average``: the mean of a run's last N checkpoints, written as a run that eval
takes (issue 23: the translation papers evaluate averaged checkpoints)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from effiformer.average import average_run, run_checkpoints
from effiformer.checkpoint import CheckpointError, load_checkpoint
from effiformer.cli import main


def test_the_average_is_the_mean_of_the_last_n_checkpoints_and_a_run_eval_takes(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "avg"
    assert main(["train", "vanilla-tiny", "--steps", "4", "--checkpoint-every", "1", "--keep",
                 "3", "--eval-every", "0", "--eval-tokens", "256", "--out", str(run)]) == 0  # fmt: skip
    capsys.readouterr()
    steps = run_checkpoints(run)
    assert [d.name for d in steps] == ["step-00000002", "step-00000003", "step-00000004"]
    assert main(["average", str(run), "--last", "2", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(next(x for x in lines if x.startswith("{")))["averaged"] == 2
    avg, meta = load_checkpoint(out)
    a, _ = load_checkpoint(steps[-1])
    b, _ = load_checkpoint(steps[-2])
    for (name, p), q, r in zip(avg.state_dict().items(), a.state_dict().values(),
                               b.state_dict().values()):  # fmt: skip
        if p.is_floating_point():
            assert_close(p, ((q.double() + r.double()) / 2).to(p.dtype), msg=name)
    assert meta["step"] == 4 and meta["task"]["task"] == "lm"
    assert (out / "step-00000004" / "vocab.json").is_file()  # the task's files came along
    assert not torch.equal(a.state_dict()["embed.weight"], avg.state_dict()["embed.weight"])
    assert main(["eval", str(out), "--eval-tokens", "256"]) == 0  # a run like any other
    capsys.readouterr()
    # too few checkpoints, and an --out that holds a run, are one clear line each
    assert main(["average", str(run), "--last", "5", "--out", str(tmp_path / "x")]) == 2
    assert "keeps 3 checkpoint(s)" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="already holds a run"):
        average_run(run, 2, out)
