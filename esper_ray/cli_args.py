"""Turn config dataclass fields into argparse flags of the same name (`max_epochs` -> `--max-epochs`).

The help text is the field's docstring, so the CLI and the config cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable
from typing import Any

from esper_ray.contracts.fields import field_docs


def _base_type(hint: Any) -> tuple[Any, bool]:
    """(type without None, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, exclude: Iterable[str] = ()
) -> list[str]:
    """Add one flag per field (default None = "not given"); return the field names added."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        hint, _ = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f"{docs.get(f.name, '')} (default: {default})".replace("%", "%%")  # argparse formats help with %
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(flag, nargs="+", default=None, metavar=f.name.upper(), help=help_text)
        else:
            parser.add_argument(flag, type=hint, default=None, metavar=f.name.upper(), help=help_text)
        names.append(f.name)
    return names


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The flags among `names` that the user actually set."""
    out = {}
    for name in names:
        value = getattr(args, name)
        if value is not None:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out
