"""Read a YAML settings file strictly: errors name the file and line, repeated keys are errors (plain YAML keeps
the last one silently, which made two arms with one name look like one arm), and an empty file is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated within one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            first = seen[key].start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping (first on line {first})", key_node.start_mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file; ValueError/FileNotFoundError with the file and line otherwise."""
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"{what} {file} does not exist")
    if not file.is_file():
        raise ValueError(f"{what} {file} is not a file")
    try:
        data = yaml.load(file.read_text(), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        problem = " ".join(p for p in (err.context, err.problem) if p)
        raise ValueError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{file}: invalid YAML: {err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{file}: not a text file") from None
    if data is None:
        raise ValueError(f"{file}: the {what} is empty; write its settings as `key: value` lines")
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a mapping of settings at the top level, got {type(data).__name__}")
    return data
