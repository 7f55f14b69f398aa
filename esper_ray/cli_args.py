"""Turn config dataclass fields into argparse flags of the same name (`max_epochs` -> `--max-epochs`).

The help text is the field's docstring, so the CLI and the config cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from esper_ray.contracts.fields import field_docs


def _base_type(hint: Any) -> tuple[Any, bool]:
    """(type without None, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def field_help(cls: type, field: dataclasses.Field, defaults: Mapping[str, Any] | None = None) -> str:
    """A field's help, as its flag or key shows it: its docstring and its default (the command's own, in `defaults`)."""
    default = field.default if field.default is not dataclasses.MISSING else None
    default = (defaults or {}).get(field.name, default)
    return f"{field_docs(cls).get(field.name, '')} (default: {default})"


def keys_help(title: str, cls: type, exclude: Iterable[str] = (), defaults: Mapping[str, Any] | None = None) -> str:
    """The fields of `cls` given as KEY=VALUE (`train --env`), one line each under `title`, with the same help as
    their flags (add_dataclass_arguments): for a parser's epilog, with formatter_class=LinesHelpFormatter."""
    return "\n".join(
        [title]
        + [f"  {f.name}: {field_help(cls, f, defaults)}" for f in dataclasses.fields(cls) if f.name not in exclude]
    )


class LinesHelpFormatter(argparse.HelpFormatter):
    """Wraps each line of a description or epilog on its own (argparse would join them), so a list of keys stays
    one key a line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            item = " " * (len(line) - len(line.lstrip()))  # an indented line is a list item: its wrap hangs
            lines.append(
                textwrap.fill(
                    " ".join(line.split()),
                    width,
                    initial_indent=indent + item,
                    subsequent_indent=indent + item + ("    " if item else ""),
                )
            )
        return "\n".join(lines)


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    exclude: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    only: Iterable[str] | None = None,
) -> list[str]:
    """Add one flag per field (default None = "not given"), or per field in `only`; return the field names added.
    `defaults`: the defaults the command applies itself where no flag is given, shown in the help instead of the
    field's."""
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.name in exclude or (only is not None and f.name not in only):
            continue
        hint, _ = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        help_text = field_help(cls, f, defaults).replace("%", "%%")  # argparse formats help with %
        if {int, str} <= set(typing.get_args(hints[f.name])):  # a count or a word (envs_per_runner: N or auto)
            parser.add_argument(flag, type=int_or_text, default=None, metavar=f.name.upper(), help=help_text)
        elif hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(flag, nargs="+", default=None, metavar=f.name.upper(), help=help_text)
        else:
            parser.add_argument(flag, type=hint, default=None, metavar=f.name.upper(), help=help_text)
        names.append(f.name)
    return names


def int_or_text(text: str) -> int | str:
    """A flag that takes a count or a word: an integer when it reads as one, else the text, which the config checks
    (its error names the field and what it allows)."""
    try:
        return int(text)
    except ValueError:
        return text


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The flags among `names` that the user actually set."""
    out = {}
    for name in names:
        value = getattr(args, name)
        if value is not None:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out
