"""Checkpoint errors name the problem; a failed save keeps the previous checkpoint."""

import json

import pytest
import torch

from effiformer import create_model, load_model, save_model
from effiformer.checkpoint import CheckpointError


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_missing_weights(tmp_path):
    save_model(create_model("vanilla-tiny"), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_model(tmp_path)


def test_truncated_weights(tmp_path):
    save_model(create_model("vanilla-tiny"), tmp_path)
    w = tmp_path / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(tmp_path)


def test_config_mismatch(tmp_path):
    save_model(create_model("vanilla-tiny"), tmp_path)
    record = json.loads((tmp_path / "config.json").read_text())
    record["config"]["dim"] = 128
    record["config"]["head_dim"] = 64
    record["config"]["ffn_dim"] = 512
    (tmp_path / "config.json").write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="does not match"):
        load_model(tmp_path)


def test_corrupt_config(tmp_path):
    save_model(create_model("vanilla-tiny"), tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid effiformer config"):
        load_model(tmp_path)


def test_failed_save_keeps_previous(tmp_path, monkeypatch):
    model = create_model("vanilla-tiny")
    save_model(model, tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()

    import effiformer.checkpoint as ck

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "_st_save_model", boom)
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_model(model, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    load_model(tmp_path)


def test_checkpoint_files_get_the_mode_of_ordinary_files(tmp_path):
    """mkstemp creates 0600; saved weights, configs and run checkpoints are 0644 (umask 022)."""
    import os

    from effiformer.checkpoint import save_run_checkpoint

    old = os.umask(0o022)
    try:
        model = create_model("vanilla-tiny")
        save_model(model, tmp_path / "m")

        class _Task:
            def artifacts(self):
                return {"vocab.json": b"{}"}

        ckpt = save_run_checkpoint(
            tmp_path / "run", 1, model, trainer_state={}, train_config={}, task=_Task()
        )
    finally:
        os.umask(old)
    files = [*(tmp_path / "m").iterdir(), *ckpt.iterdir(), tmp_path / "run" / "latest"]
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {"0o644"}, modes


def test_load_model_takes_a_run_directory(tmp_path):
    from effiformer.checkpoint import save_run_checkpoint

    torch.manual_seed(0)
    model = create_model("vanilla-tiny")

    class _Task:
        pass

    for step in (1, 2):
        save_run_checkpoint(
            tmp_path / "run", step, model, trainer_state={}, train_config={}, task=_Task(), keep=2
        )
    loaded = load_model(tmp_path / "run")  # its latest checkpoint, step-00000002
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    assert isinstance(load_model(tmp_path / "run" / "step-00000001"), type(model))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_model(tmp_path / "empty")


def test_a_field_added_after_a_checkpoint_was_saved_reads_as_its_default(tmp_path):
    """A checkpoint written before a config field existed (here: ``ffn_bias``, removed from the
    saved config) matches a model with that field's default and not one without it; resuming
    such a run used to fail with "checkpoint None, model True"."""
    from effiformer.checkpoint import check_config_matches

    save_model(create_model("vanilla-tiny"), tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    record = json.loads(path.read_text())
    del record["config"]["ffn_bias"]
    path.write_text(json.dumps(record))
    check_config_matches(tmp_path / "m", create_model("vanilla-tiny"))  # the default: matches
    with pytest.raises(CheckpointError, match="ffn_bias: checkpoint True, model False"):
        check_config_matches(tmp_path / "m", create_model("vanilla-tiny", ffn_bias=False))
    assert load_model(tmp_path / "m").config.ffn_bias is True
