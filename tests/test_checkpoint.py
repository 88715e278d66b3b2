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
