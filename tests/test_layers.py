"""The package's layers only import downwards (DESIGN.md), and only policy/train/experiments touch Ray."""

from __future__ import annotations

import ast
from pathlib import Path

import esper_ray

PACKAGE = Path(esper_ray.__file__).parent
LAYER = {"cli_args": 6, "deferred_interrupt": 6, "cli": 7, "entry": 8, "contracts": 0, "morpho": 1, "data": 1, "rewards": 1, "env": 2, "policy": 3, "train": 4, "experiments": 5}
RAY_ALLOWED = {"policy", "train", "experiments", "cli", "cli_args"}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_every_module_imports_only_lower_layers_and_ray_stays_out_of_the_core():
    problems = []
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 10
    for path in modules:
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue
        layer = rel.parts[0].removesuffix(".py")
        for name in imports_of(path):
            parts = name.split(".")
            if parts[0] == "ray" and layer not in RAY_ALLOWED:
                problems.append(f"{rel} imports {name}: Ray belongs to {sorted(RAY_ALLOWED)}")
            if parts[0] != "esper_ray" or len(parts) < 2:
                continue
            target = parts[1]
            if target == layer:
                continue
            if LAYER[target] >= LAYER[layer]:
                problems.append(f"{rel} ({layer}) imports {name} ({target}): layers import only downwards")
    assert not problems, "\n".join(problems)
