"""Helpers for config dataclasses: strict construction from a mapping, and the docstrings under fields (so
`--help` shows the config's own words)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

MAX_INT = 2**32 - 1
"""The largest integer a setting takes unless it names a smaller bound: numpy's seeds are 32-bit, and a count
beyond it (a typo's 10**23) would run for ever or overflow inside numpy or torch far from the file."""


def check_int(name: str, value: Any, minimum: int, maximum: int = MAX_INT) -> None:
    """Raise ValueError naming the field unless `value` is an integer (not a bool) in [`minimum`, `maximum`]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
    if value > maximum:
        raise ValueError(
            f"{name}={value:.3g}: must be an integer <= {maximum:,}"
            if value > 10**12
            else f"{name}={value:,}: must be an integer <= {maximum:,}"
        )


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal that follows its definition} for a dataclass defined in source."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def check_keys(cls: type, mapping: Mapping[str, Any], what: str, also: Iterable[str] = ()) -> None:
    """Raise ValueError naming unknown keys and listing the valid ones (configs are strict); `also`: keys valid
    besides the fields."""
    valid = {f.name for f in dataclasses.fields(cls)} | set(also)
    unknown = sorted(set(mapping) - valid)
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; valid keys: {sorted(valid)}")


def _describe(hint: Any) -> str:
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a finite number"
    if hint is str:
        return "a string"
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    return "a mapping of settings"


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    if origin is Mapping or hint is Mapping:
        return isinstance(value, Mapping)
    if dataclasses.is_dataclass(hint):  # a config inside a config (TrainConfig.env): built, and checked, already
        return isinstance(value, hint)
    raise TypeError(f"check_types does not know the annotation {hint!r}")


def check_types(obj: Any) -> None:
    """Raise ValueError `name=value: must be ...` for any field whose value does not fit its annotation.

    Runs first in a config's __post_init__, so the range checks after it never meet a wrong type (a string
    where a number belongs would otherwise escape as a TypeError).
    """
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        hint = hints[f.name]
        if not _matches(value, hint):
            allowed = [_describe(h) for h in typing.get_args(hint) if h is not type(None)] or [_describe(hint)]
            optional = type(None) in typing.get_args(hint)
            raise ValueError(
                f"{f.name}={value!r}: must be {' or '.join(allowed)}{' (or left out)' if optional else ''}"
            )


def parse_env_overrides(pairs: list[str] | None) -> dict[str, Any]:
    import yaml  # here, not at import: a Ctrl-C while a command loads is handled from entry.py on

    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {pair!r}: expected KEY=VALUE, e.g. --env batch_size=128")
        out[key.strip()] = yaml.safe_load(value)
    return out


def shared_name(checkpoint: Path) -> str:
    """How a file meant for sharing (summary.md, architecture.json) names a checkpoint: by the run folder's name and
    the path inside it (RUN/checkpoints/round_NNNNN), wherever the command ran. Never relative to the current folder
    (run from / that is the whole path, with the user's name from /home) nor an absolute path of this machine."""
    return "/".join(checkpoint.expanduser().resolve().parts[-3:])
