"""Helpers for config dataclasses: strict construction from a mapping, and the docstrings under fields (so
`--help` shows the config's own words)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Mapping
from functools import cache
from typing import Any


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


def check_keys(cls: type, mapping: Mapping[str, Any], what: str) -> None:
    """Raise ValueError naming unknown keys and listing the valid ones (configs are strict)."""
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - valid)
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; valid keys: {sorted(valid)}")
