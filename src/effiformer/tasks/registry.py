"""Tasks by name: ``register_task(name, options, build, ...)``, ``get_task(name)``, ``list_tasks()``.

A registered task is a :class:`TaskSpec`:

``options``
    a frozen, keyword-only dataclass of the task's settings. Each field carries its help text in
    its metadata (:func:`task_option`), so a front end (``effiformer train``) turns every field
    into a flag without knowing the task: field ``seq_len`` is ``--seq-len`` (``flag=`` in the
    metadata renames it), its type and default come from the dataclass, ``choices`` and
    ``metavar`` from the metadata. A field without a default is required. Validation happens in
    the dataclass's ``__post_init__``, which raises ``ValueError`` naming the field.
``build(options, context) -> TaskSetup``
    the task and the model to train on it (:class:`TaskSetup`); ``context``
    (:class:`BuildContext`) carries what every task may use: the registered model name, the
    ``--set`` config overrides, the seed and the checkpoint a run resumes from.
``eval_options`` / ``evaluate(checkpoint, meta, options, *, split, device) -> EvalReport``
    how ``effiformer eval`` scores a checkpoint this task trained (``evaluate=None``: it cannot).
``load_model(checkpoint, options) -> nn.Module``
    the trained model of a checkpoint this task wrote, for tasks that start from it (GLUE
    fine-tuning from a pretraining run); ``None``: :func:`effiformer.checkpoint.load_checkpoint`.

Task modules register themselves when imported; :mod:`effiformer.tasks` imports them from an
explicit list. Adding a task is its own file plus one line in that list.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..config import closest
from ..recipes import TrainRecipe

__all__ = [
    "BuildContext",
    "EvalReport",
    "TaskSetup",
    "TaskSpec",
    "UnknownTaskError",
    "flag_of",
    "get_task",
    "list_tasks",
    "make_options",
    "register_task",
    "task_option",
]


class UnknownTaskError(KeyError):
    """An unregistered task name; the message lists the registered names, closest first."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def task_option(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    metavar: str | None = None,
    choices: Sequence[Any] | None = None,
) -> Any:
    """A dataclass field of a task's options with its help text (and optional ``flag``,
    ``metavar``, ``choices``) in the metadata; no ``default`` makes it required."""
    meta = {"help": help, "flag": flag, "metavar": metavar, "choices": choices}
    return field(default=default, metadata=meta)


def flag_of(options: type, name: str) -> str:
    """The command-line flag of field ``name`` of an options class (``seq_len`` -> ``--seq-len``)."""
    for f in dataclasses.fields(options):
        if f.name == name:
            return f.metadata.get("flag") or "--" + name.replace("_", "-")
    raise KeyError(f"{options.__name__} has no option {name!r}")


@dataclass(frozen=True)
class BuildContext:
    """What a task's ``build`` gets besides its options: ``model_name`` (a registered name, or
    the name recorded in the resumed run), ``overrides`` (``KEY=VALUE`` config items),
    ``seed`` (weights, dropout and data order) and ``resume`` (the checkpoint directory a run
    continues from: build the model from its config; the trainer loads its weights)."""

    model_name: str | None = None
    overrides: tuple[str, ...] = ()
    seed: int = 0
    resume: Path | None = None


@dataclass
class TaskSetup:
    """What ``build`` returns: the ``task`` and the ``model`` to train on it, the name recorded for
    the model (``model_name``) and the data (``data_name``), and the training ``recipe`` when the
    task has its own (fine-tuning); ``None``: the model family's recipe."""

    task: Any
    model: nn.Module
    model_name: str
    data_name: str
    recipe: TrainRecipe | None = None


@dataclass
class EvalReport:
    """What ``evaluate`` returns: a JSON-able ``record`` and an optional human ``summary`` line."""

    record: dict[str, Any]
    summary: str | None = None


@dataclass(frozen=True)
class TaskSpec:
    """A registered task (see the module docstring)."""

    name: str
    options: type
    build: Callable[[Any, BuildContext], TaskSetup]
    description: str = ""
    eval_options: type | None = None
    evaluate: Callable[..., EvalReport] | None = None
    load_model: Callable[[Path, Any], nn.Module] | None = None


_TASKS: dict[str, TaskSpec] = {}
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def _check_options_class(name: str, cls: type | None) -> None:
    if cls is None:
        return
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"task {name!r}: options must be a dataclass type, got {cls!r}")
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"task {name!r}: {cls.__name__} must be a frozen dataclass")
    for f in dataclasses.fields(cls):
        if not f.metadata.get("help"):
            raise TypeError(
                f"task {name!r}: option {cls.__name__}.{f.name} has no help text "
                "(declare it with task_option(default, help))"
            )


def register_task(
    name: str,
    options: type,
    build: Callable[[Any, BuildContext], TaskSetup],
    *,
    description: str = "",
    eval_options: type | None = None,
    evaluate: Callable[..., EvalReport] | None = None,
    load_model: Callable[[Path, Any], nn.Module] | None = None,
) -> TaskSpec:
    """Register a task under ``name`` (lowercase, hyphenated); see the module docstring."""
    if not _NAME.match(name):
        raise ValueError(f"task names are lowercase and hyphenated, got {name!r}")
    if name in _TASKS:
        raise ValueError(f"task {name!r} is already registered")
    _check_options_class(name, options)
    _check_options_class(name, eval_options)
    if evaluate is not None and eval_options is None:
        raise TypeError(f"task {name!r}: evaluate needs an eval_options class")
    spec = TaskSpec(
        name=name,
        options=options,
        build=build,
        description=description,
        eval_options=eval_options,
        evaluate=evaluate,
        load_model=load_model,
    )
    _TASKS[name] = spec
    return spec


def get_task(name: str) -> TaskSpec:
    """The registered task ``name`` (``UnknownTaskError`` lists the closest names)."""
    if name not in _TASKS:
        raise UnknownTaskError(
            f"unknown task {name!r}; registered tasks (closest first): "
            f"{', '.join(closest(name, list(_TASKS)))}"
        )
    return _TASKS[name]


def list_tasks(pattern: str = "*") -> list[str]:
    """Registered task names matching the glob ``pattern``, in registration order."""
    return [n for n in _TASKS if fnmatch.fnmatchcase(n, pattern)]


def make_options(cls: type, values: Mapping[str, Any], *, owner: str | None = None) -> Any:
    """``cls(**values)`` with unknown keys named (closest first) and JSON lists back to tuples;
    missing required fields raise ``ValueError`` naming their flags (``"<owner> needs --init
    RUN"``)."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ValueError(
            f"unknown option {unknown[0]!r} for {cls.__name__}; options (closest first): "
            f"{', '.join(closest(unknown[0], names))}"
        )
    missing = [
        f
        for f in dataclasses.fields(cls)
        if f.default is MISSING and f.default_factory is MISSING and f.name not in values
    ]
    if missing:
        wanted = ", ".join(
            f"{flag_of(cls, f.name)} {f.metadata.get('metavar') or f.name.upper()}" for f in missing
        )
        raise ValueError(f"{owner or cls.__name__} needs {wanted}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**kwargs)
