"""Checkpoints, written atomically: model weights (safetensors + the config as JSON) and the run
checkpoints of :func:`effiformer.train.train`.

A **model checkpoint** directory holds ``model.safetensors`` and ``config.json`` (``family``,
``name``, ``config``): :func:`save_model` / :func:`load_model`. Saving writes to temporary files
and renames them into place, so an interrupted save never destroys the previous checkpoint.

A **run checkpoint** (:func:`save_run_checkpoint`) is a model checkpoint plus what resumes the run:
``OUT/step-00000100/`` holds ``model.safetensors`` + ``config.json``, the task's files
(``vocab.json``, ``tokenizer.json``), ``trainer.pt`` (the trainer's state: optimiser, scheduler,
RNG states of every rank, data position, step, recurrent state), ``train_config.json`` and,
written last, ``meta.json`` with the size and sha256 of every file. It is written into
``OUT/.step-00000100.tmp/``, renamed into place, and only then is ``OUT/latest`` (the name of the
newest complete checkpoint) replaced atomically; older checkpoints beyond ``keep`` are removed
after that. So a run killed at any moment leaves ``latest`` pointing at a complete checkpoint.
:func:`resolve_checkpoint` turns a run directory into its latest checkpoint,
:func:`verify_checkpoint` checks every file against ``meta.json``, :func:`load_checkpoint`
rebuilds the model (with runtime ``overrides`` such as a longer ``mem_len``) and
:func:`read_trainer_state` gives the trainer what it resumes from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model
from torch import nn

from .config import ModelConfig, replace_config
from .registry import build_model, family_config_class

__all__ = [
    "CheckpointError",
    "CONFIG",
    "LATEST",
    "RecordedTask",
    "META",
    "TRAINER_STATE",
    "TRAIN_CONFIG",
    "WEIGHTS",
    "atomic_write_bytes",
    "check_config_matches",
    "load_checkpoint",
    "load_config",
    "load_model",
    "load_weights",
    "read_train_config",
    "read_trainer_state",
    "resolve_checkpoint",
    "run_dir_of",
    "save_model",
    "save_run_checkpoint",
    "verify_checkpoint",
]

logger = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TRAINER_STATE = "trainer.pt"
TRAIN_CONFIG = "train_config.json"
META = "meta.json"
LATEST = "latest"
_CKPT_FORMAT = "effiformer-train-checkpoint"
_CKPT_VERSION = 1


class CheckpointError(ValueError):
    """A missing, truncated, corrupt or mismatched checkpoint."""


def _file_mode() -> int:
    """The mode ``open()`` gives a new file (0666 less the umask; 0644 under the usual 022).
    ``mkstemp`` creates 0600, which would make checkpoints unreadable to other users."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _mkstemp(directory: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp`` with the mode of an ordinary new file."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    try:
        os.fchmod(fd, _file_mode())
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``
    (the file gets the mode of an ordinary new file, 0644 under the usual umask)."""
    path = Path(path)
    fd, tmp = _mkstemp(path.parent, f".{path.name}.", ".tmp")
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
        _st_save_model(model, tmp)  # handles tied (shared) weights; writes a new file
        os.chmod(tmp, _file_mode())
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
    """Rebuild the model recorded in ``directory`` and load its weights (strict: every key).

    ``directory``: a model checkpoint (:func:`save_model`), a run checkpoint, or a run directory
    of ``effiformer train`` (its ``latest`` checkpoint, :func:`resolve_checkpoint`)."""
    directory = Path(directory)
    if directory.is_dir() and not (directory / CONFIG).exists():
        directory = resolve_checkpoint(directory)
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


# ------------------------------------------------------------------------------------------------
# Run checkpoints
# ------------------------------------------------------------------------------------------------


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint directory ``path`` names: itself, or ``path/<latest>`` for a run directory."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint directory {str(p)!r} does not exist")
    if not p.is_dir():
        raise CheckpointError(f"{str(p)!r} is not a directory (expected a checkpoint directory)")
    if (p / META).exists() or (p / CONFIG).exists() or (p / TRAINER_STATE).exists():
        return p
    if (p / LATEST).is_file():
        name = (p / LATEST).read_text().strip()
        target = p / name
        if not name or not target.is_dir():
            raise CheckpointError(
                f"{str(p / LATEST)!r} points at {name!r}, which is not a checkpoint directory"
            )
        return target
    raise CheckpointError(
        f"{str(p)!r} holds no checkpoint (no {META} and no {LATEST!r} pointer to one)"
    )


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint belongs to (its parent when that holds ``latest``)."""
    return checkpoint.parent if (checkpoint.parent / LATEST).is_file() else checkpoint


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_checkpoint(directory: str | os.PathLike) -> dict[str, Any]:
    """Check that every file of a run checkpoint is present and intact; return its meta.

    Raises :class:`CheckpointError` naming a missing, truncated or altered file.
    """
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {str(d)!r} does not exist")
    meta_path = d / META
    if not meta_path.is_file():
        raise CheckpointError(
            f"checkpoint {str(d)!r} is incomplete: it has no {META} (written last by a save, so "
            "the save was interrupted or this is not a training checkpoint)"
        )
    try:
        meta = json.loads(meta_path.read_text())
        files = meta["files"]
        if meta.get("format") != _CKPT_FORMAT:
            raise KeyError("format")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{str(meta_path)!r} is not a valid checkpoint meta file: {e}") from e
    for name, info in files.items():
        p = d / name
        if not p.is_file():
            raise CheckpointError(f"checkpoint {str(d)!r} is missing {name}")
        size = p.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(
                f"checkpoint file {str(p)!r} is truncated or altered: {size} bytes, "
                f"expected {info['bytes']}"
            )
        if _sha256(p) != info["sha256"]:
            raise CheckpointError(f"checkpoint file {str(p)!r} is corrupt (sha256 mismatch)")
    return meta


def read_train_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``train_config.json`` of a run checkpoint as a dict (``{}`` when it has none)."""
    path = Path(directory) / TRAIN_CONFIG
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {e}") from e


def _fsync_dir_files(d: Path) -> None:
    for p in d.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())


class RecordedTask:
    """A stand-in task for :func:`save_run_checkpoint` when the run being written was not
    trained here (an averaged or an exported model): what the checkpoint records of its task
    (``describe()``, the source run's) and the task's files (``artifacts()``: vocabulary,
    tokenizer, language pair)."""

    def __init__(self, described: dict[str, Any], files: dict[str, bytes]) -> None:
        self._described, self._files = dict(described), dict(files)

    def describe(self) -> dict[str, Any]:
        return dict(self._described)

    def artifacts(self) -> dict[str, bytes]:
        return dict(self._files)


def save_run_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    module: nn.Module,
    *,
    trainer_state: dict[str, Any],
    train_config: dict[str, Any],
    task: Any,
    model_name: str | None = None,
    world: int = 1,
    keep: int | None = 1,
) -> Path:
    """Write the run checkpoint of ``step`` into ``out_dir`` (see the module docstring): the
    model, ``task.artifacts()``, ``trainer_state`` (``torch.save``), ``train_config`` (JSON) and
    ``meta.json`` last, then move ``latest`` and prune to the ``keep`` newest checkpoints."""
    out_dir = Path(out_dir)
    name = step_dir_name(step)
    final = out_dir / name
    latest = out_dir / LATEST
    if latest.is_file() and latest.read_text().strip() == name and final.is_dir():
        logger.info("checkpoint %s already holds step %d", final, step)
        return final
    tmp = out_dir / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(module, tmp, name=model_name)
    artifacts = getattr(task, "artifacts", None)
    for fname, data in (artifacts() if artifacts is not None else {}).items():
        (tmp / fname).write_bytes(data)
    torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / TRAIN_CONFIG).write_text(json.dumps(train_config, indent=2))
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())
    }
    meta = {
        "format": _CKPT_FORMAT,
        "version": _CKPT_VERSION,
        "step": step,
        "world": world,
        "model_name": model_name,
        "task": task.describe() if hasattr(task, "describe") else {},
        "torch": torch.__version__,
        "files": files,
    }
    (tmp / META).write_text(json.dumps(meta, indent=2))
    _fsync_dir_files(tmp)
    if final.exists():  # a leftover of an interrupted save; latest does not point at it
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_bytes(latest, name.encode())
    _prune_checkpoints(out_dir, keep=keep, latest=name)
    logger.info("saved checkpoint %s", final)
    return final


def _prune_checkpoints(out_dir: Path, *, keep: int | None, latest: str) -> None:
    for p in out_dir.glob(".step-*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    if keep is None:
        return
    steps = sorted(p for p in out_dir.glob("step-*") if p.is_dir() and p.name != latest)
    for p in steps[: max(0, len(steps) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)


def _json_normal(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def check_config_matches(directory: str | os.PathLike, module: nn.Module) -> None:
    """Raise :class:`CheckpointError` listing every field where ``module.config`` differs from
    the config saved in ``directory``."""
    directory = Path(directory)
    try:
        record = json.loads((directory / CONFIG).read_text())
        saved_family, saved = record["family"], record["config"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {str(directory)!r} has no valid {CONFIG}: {e}") from e
    config = getattr(module, "config", None)
    if config is None:
        return
    if saved_family != config.family:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is a {saved_family!r} model, not {config.family!r}"
        )
    current = _json_normal(config.to_dict())
    # a field the checkpoint does not record (added to the config class after it was saved)
    # means that field's default, which is what the checkpoint's model had
    missing = {
        k: v.to_dict() if hasattr(v, "to_dict") else v
        for k, v in _field_defaults(type(config)).items()
        if k not in saved
    }
    saved = {**_json_normal(missing), **saved}
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r}, model {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is from another configuration: {'; '.join(diffs)}"
        )


def _field_defaults(cls: type) -> dict[str, Any]:
    """The default of every dataclass field of ``cls`` that has one."""
    import dataclasses

    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def load_weights(
    module: nn.Module, directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> None:
    """Load ``directory/model.safetensors`` into ``module``, strictly (every key, every shape)."""
    path = Path(directory) / WEIGHTS
    try:
        missing, unexpected = _st_load_model(module, path, strict=False, device=str(device))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CheckpointError(
            f"{str(path)!r} is truncated or corrupt, or its shapes do not match the config: {e}"
        ) from e
    if missing or unexpected:
        raise CheckpointError(
            f"{str(path)!r} does not match the model: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )


def read_trainer_state(
    directory: str | os.PathLike, module: nn.Module, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Verify a run checkpoint, check that ``module`` has its config, load its weights into
    ``module`` and return the trainer state saved with it (``trainer.pt``)."""
    directory = Path(directory)
    verify_checkpoint(directory)
    check_config_matches(directory, module)
    load_weights(module, directory, device)
    try:
        return torch.load(directory / TRAINER_STATE, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated pickles raise many types
        raise CheckpointError(f"{str(directory / TRAINER_STATE)!r} cannot be read: {e}") from e


def load_checkpoint(
    directory: str | os.PathLike,
    *,
    map_location: str | torch.device = "cpu",
    overrides: dict[str, Any] | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a run checkpoint (a run directory or one checkpoint directory).

    ``overrides``: config fields to change that do not change the weights' shapes (``mem_len``,
    ``clamp_len``, ...; an unknown field is a :class:`~effiformer.config.ConfigError`).
    Returns ``(model, meta)``; ``meta["task"]`` describes the data it was trained on and
    ``meta["path"]`` is the checkpoint directory.
    """
    d = resolve_checkpoint(directory)
    meta = verify_checkpoint(d)
    config = load_config(d)
    if overrides:
        config = replace_config(config, **overrides)
    model = build_model(config)
    load_weights(model, d, torch.device(map_location))
    meta["path"] = str(d)
    return model, meta
