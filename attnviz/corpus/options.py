"""A run's settings declared once, as dataclass fields, and read from there both as JSON and as command-line options:
a setting added to :class:`~attnviz.corpus.scan.runner.ScanSettings` (or any settings dataclass) is written by the
page's job, read by the child process and offered by ``python -m attnviz.corpus.scan`` without another line.

A field's ``metadata`` (made by :func:`option`) holds its help and, where the command line spells it otherwise, its
flag. JSON is checked before a dataclass is built from it (:func:`checked_values`): only the fields' names, each with
a value of its field's type, so a settings file cannot slip a string where a number belongs or a key nothing reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any


class SettingsRefused(ValueError):
    """A settings file (or mapping) holds what no field takes, or a value of the wrong type; says which."""


def option(help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None,
           metavar: str | None = None, positional: bool = False, default_words: str | None = None) -> dict:
    """A field's metadata: its ``help`` on the command line, and where the generated option differs from
    ``--field-name``: its ``flag``, ``choices``, ``metavar``, a ``positional`` argument, or ``default_words`` shown
    for its default."""
    return {"help": help, "flag": flag, "choices": choices, "metavar": metavar, "positional": positional,
            "default_words": default_words}


def field_types(cls: type) -> dict[str, Any]:
    """Each field's type, its annotation resolved (the modules write ``from __future__ import annotations``)."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _parts(kind: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether ``None`` is allowed)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        others = [part for part in typing.get_args(kind) if part is not type(None)]
        return others[0], len(others) < len(typing.get_args(kind))
    return kind, False


def _is_text_tuple(kind: Any) -> bool:
    return typing.get_origin(kind) is tuple and typing.get_args(kind) == (str, ...)


def _checked(name: str, kind: Any, value: Any) -> Any:
    """``value`` as field ``name`` of type ``kind`` holds it (a JSON list becomes a tuple), or refused."""
    base, optional = _parts(kind)
    if value is None and optional:
        return None
    if base is bool and isinstance(value, bool):
        return value
    if base in (int, str) and isinstance(value, base) and not isinstance(value, bool):
        return value
    if _is_text_tuple(base) and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    wanted = "a list of strings" if _is_text_tuple(base) else getattr(base, "__name__", str(base))
    raise SettingsRefused(f"{name} must be {wanted}{' or null' if optional else ''}, not {value!r}"[:300])


def checked_values(classes: tuple[type, ...], values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` (a settings file's, a command line's) checked against the fields of ``classes``: refused, naming
    ``where``, when a key is no field of theirs or a value is not of its field's type."""
    types_by_name = {name: kind for cls in classes for name, kind in field_types(cls).items()}
    unknown = sorted(set(values) - set(types_by_name))
    if unknown:
        raise SettingsRefused(f"{where} holds {', '.join(map(repr, unknown[:5]))}: no setting of that name (the "
                              f"settings are {', '.join(types_by_name)})")
    return {name: _checked(name, types_by_name[name], value) for name, value in values.items()}


def built(cls: type, values: Mapping[str, Any]):
    """An instance of ``cls`` from the (checked) values that name its fields; its own defaults for the rest."""
    names = {field.name for field in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in values.items() if name in names})


def as_json(instance) -> dict[str, Any]:
    """A settings dataclass as a JSON object (a tuple as a list): what :func:`checked_values` reads back."""
    return {field.name: list(value) if isinstance(value := getattr(instance, field.name), tuple) else value
            for field in dataclasses.fields(instance)}


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _shown_default(field: dataclasses.Field, metadata: Mapping) -> str:
    if metadata.get("default_words"):
        return f" (default: {metadata['default_words']})"
    default = field.default
    if default is dataclasses.MISSING or default is None or isinstance(default, bool):
        return ""
    if isinstance(default, tuple):
        return f" (default: {','.join(default)})"
    return f" (default: {default:,})" if isinstance(default, int) else f" (default: {default})"


def _argument_type(kind: Any) -> Callable[[str], Any] | None:
    base, _ = _parts(kind)
    return _comma_list if _is_text_tuple(base) else base if base in (int, str) else None


def add_options(parser: argparse.ArgumentParser, cls: type, helps: Mapping[str, str] | None = None) -> None:
    """One command-line option per field of ``cls``, with its help and default (a field's help can be replaced
    through ``helps``). Nothing given keeps nothing in the namespace: :func:`given` tells what was given, so a
    settings file's values hold where the command line says nothing."""
    kinds = field_types(cls)
    for field in dataclasses.fields(cls):
        metadata = field.metadata
        words = (helps or {}).get(field.name, metadata.get("help", "")) + _shown_default(field, metadata)
        if metadata.get("positional"):
            parser.add_argument(field.name, nargs="?", default=argparse.SUPPRESS, help=words)
            continue
        flag = metadata.get("flag") or "--" + field.name.replace("_", "-")
        if _parts(kinds[field.name])[0] is bool:
            parser.add_argument(flag, dest=field.name, action="store_true", default=argparse.SUPPRESS, help=words)
            continue
        parser.add_argument(flag, dest=field.name, type=_argument_type(kinds[field.name]), default=argparse.SUPPRESS,
                            choices=metadata.get("choices"), metavar=metadata.get("metavar"), help=words)


def given(namespace: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s fields that the command line gave."""
    return {field.name: getattr(namespace, field.name) for field in dataclasses.fields(cls)
            if hasattr(namespace, field.name)}


def field_names(cls: type) -> list[str]:
    return [field.name for field in dataclasses.fields(cls)]


def required(cls: type) -> list[str]:
    """The fields of ``cls`` without a default: what a run cannot go without."""
    return [field.name for field in dataclasses.fields(cls)
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
