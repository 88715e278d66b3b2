"""Model checkpoints: weights in safetensors plus the config as JSON, written atomically.

A checkpoint directory holds ``model.safetensors`` and ``config.json`` (``family``, ``name``,
``config``). Saving writes to temporary files and renames them into place, so an interrupted save
never destroys the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model
from torch import nn

from .config import ModelConfig
from .registry import build_model, family_config_class

__all__ = ["save_model", "load_model", "load_config", "CheckpointError", "atomic_write_bytes"]

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


class CheckpointError(ValueError):
    """A missing, truncated, corrupt or mismatched checkpoint."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _config_record(model: nn.Module, name: str | None) -> dict[str, Any]:
    config: ModelConfig = model.config  # type: ignore[assignment]
    return {"family": config.family, "name": name, "config": config.to_dict()}


def save_model(model: nn.Module, directory: str | os.PathLike, *, name: str | None = None) -> Path:
    """Save ``model``'s weights and config into ``directory`` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".model.", suffix=".safetensors.tmp")
    os.close(fd)
    try:
        _st_save_model(model, tmp)  # handles tied (shared) weights
        os.replace(tmp, directory / WEIGHTS)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    atomic_write_bytes(
        directory / CONFIG, json.dumps(_config_record(model, name), indent=2).encode()
    )
    return directory


def load_config(directory: str | os.PathLike) -> ModelConfig:
    directory = Path(directory)
    path = directory / CONFIG
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(directory)!r} has no {CONFIG}")
    try:
        record = json.loads(path.read_text())
        cls = family_config_class(record["family"])
        fields = record["config"]
        hints = {f: v for f, v in fields.items()}
        for k, v in hints.items():  # JSON lists back to tuples
            if isinstance(v, list):
                fields[k] = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        return cls(**fields)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{str(path)!r} is not a valid effiformer config: {e}") from e


def load_model(
    directory: str | os.PathLike, *, map_location: str | torch.device = "cpu"
) -> nn.Module:
    """Rebuild the model recorded in ``directory`` and load its weights (strict: every key)."""
    directory = Path(directory)
    config = load_config(directory)
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {str(directory)!r} has no {WEIGHTS}")
    model = build_model(config)
    try:
        missing, unexpected = _st_load_model(model, weights, strict=False, device=str(map_location))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CheckpointError(
            f"{str(weights)!r} is truncated or corrupt, or does not match the config: {e}"
        ) from e
    if missing or unexpected:
        raise CheckpointError(
            f"{str(weights)!r} does not match its config: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    return model
