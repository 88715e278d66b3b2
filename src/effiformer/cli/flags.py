"""Task options as flags: every field of every registered task's options dataclass becomes one
flag, generically (the CLI knows no task).

Fields of the same name in several tasks share a flag; its help names which tasks take it and
their defaults. Flags default to "not given" (``argparse.SUPPRESS``), so a task's own default
applies and a flag that the chosen task does not take is an error naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any

__all__ = ["OptionFlags", "add_option_flags"]

_PREFIX = "opt__"


@dataclass
class _Flag:
    flag: str
    dest: str
    kind: str  # "value" | "store_true" | "bool"
    type: Any = None
    choices: tuple | None = None
    metavar: str | None = None
    fields: dict[str, str] = field(default_factory=dict)  # task -> field name
    helps: list[tuple[str, str, Any]] = field(default_factory=list)  # (task, help, default)


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(the non-None type of an annotation, whether None is allowed)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"option type {tp} has more than one non-None type")
        return args[0], True
    return tp, False


def _label(tasks: list[str], registered: Sequence[str]) -> str:
    """``glue-sst2, glue-cola, ...`` -> ``glue-*`` when every registered ``glue-`` task is in."""
    out: list[str] = []
    done: set[str] = set()
    for t in tasks:
        if t in done:
            continue
        prefix = t.split("-")[0] + "-"
        family = [r for r in registered if r.startswith(prefix)]
        if "-" in t and len(family) > 1 and all(r in tasks for r in family):
            out.append(prefix + "*")
            done.update(family)
        else:
            out.append(t)
            done.add(t)
    return ", ".join(out)


class OptionFlags:
    """The flags made from a set of ``(task name, options class)`` pairs."""

    def __init__(self, flags: dict[str, _Flag], tasks: Sequence[str]) -> None:
        self.flags = flags
        self.tasks = list(tasks)

    def values(self, args: argparse.Namespace, task: str, *, what: str) -> dict[str, Any]:
        """The options of ``task`` given on the command line, by field name; a flag ``task``
        does not take is a ``ValueError`` (``what`` names the command: ``--task mlm``)."""
        out: dict[str, Any] = {}
        for f in self.flags.values():
            if not hasattr(args, f.dest):
                continue
            if task not in f.fields:
                takers = _label(list(f.fields), self.tasks)
                raise ValueError(f"{what} does not take {f.flag} (that is for: {takers})")
            out[f.fields[task]] = getattr(args, f.dest)
        return out


def add_option_flags(
    parser: argparse.ArgumentParser,
    specs: Sequence[tuple[str, type | None]],
    *,
    title: str,
    description: str | None = None,
) -> OptionFlags:
    """Add one flag per option field of ``specs`` (task name, options class) to ``parser``, in a
    group of its own; return what turns parsed args back into each task's options."""
    registered = [name for name, _ in specs]
    flags: dict[str, _Flag] = {}
    for task, cls in specs:
        if cls is None:
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            meta = f.metadata
            flag = meta.get("flag") or "--" + f.name.replace("_", "-")
            tp, _ = _base_type(hints[f.name])
            if tp is bool:
                kind = "store_true" if f.default is False else "bool"
            elif tp in (int, float, str):
                kind = "value"
            else:
                raise TypeError(f"{cls.__name__}.{f.name}: options must be int, float, str, bool")
            choices = tuple(meta["choices"]) if meta.get("choices") else None
            entry = flags.setdefault(
                flag,
                _Flag(
                    flag=flag,
                    dest=_PREFIX + flag.lstrip("-").replace("-", "_"),
                    kind=kind,
                    type=tp,
                    choices=choices,
                    metavar=meta.get("metavar") or (None if choices else f.name.upper()),
                ),
            )
            if (entry.kind, entry.type) != (kind, tp):
                raise TypeError(
                    f"{flag}: task {task!r} declares it as {tp.__name__} ({kind}), another task "
                    f"as {entry.type.__name__} ({entry.kind})"
                )
            if choices and entry.choices != choices:
                entry.choices = tuple(dict.fromkeys((entry.choices or ()) + choices))
            entry.fields[task] = f.name
            entry.helps.append((task, meta.get("help", ""), f.default))
    existing = set(parser._option_string_actions)  # noqa: SLF001 (argparse keeps no public list)
    clash = sorted(set(flags) & existing)
    if clash:
        raise TypeError(f"task options {clash} clash with the command's own flags")
    group = parser.add_argument_group(title, description)
    for f in flags.values():
        kwargs: dict[str, Any] = {
            "dest": f.dest,
            "default": argparse.SUPPRESS,
            "help": _help(f, registered),
        }
        if f.kind == "store_true":
            kwargs["action"] = "store_true"
        elif f.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = f.type
            if f.choices:
                kwargs["choices"] = f.choices
            if f.metavar:
                kwargs["metavar"] = f.metavar
        group.add_argument(f.flag, **kwargs)
    return OptionFlags(flags, registered)


def _help(f: _Flag, registered: Sequence[str]) -> str:
    """``lm: tokens per row (default: ...); mlm, electra: ... (default 128)``."""
    groups: dict[str, list[str]] = {}
    for task, text, default in f.helps:
        if default is MISSING:
            note = "required"
        elif default is None or default is False:
            note = ""
        else:
            note = f"default {default}"
        shown = text if not note or "default" in text else f"{text} ({note})"
        groups.setdefault(shown, []).append(task)
    parts = [f"{_label(names, registered)}: {text}" for text, names in groups.items()]
    return "; ".join(parts).replace("%", "%%")
