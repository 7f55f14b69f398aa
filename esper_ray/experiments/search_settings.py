"""A `search` arm's settings (`search: {budget: 16, algorithm: random}`), read without importing Ray: an experiment
file is checked before Ray starts (plan_search.py runs the search)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from esper_ray.contracts.train_config import MAX_COUNT

ALGORITHMS = ("random", "tpe")
"""Search algorithms a `search` arm may name: Tune's random search, and Tune's OptunaSearch with Optuna's TPE sampler
(what a user would pick beside random; needs the optional extra `optuna`)."""
NEEDS_OPTUNA = ("tpe",)
OPTUNA_EXTRA = "pip install 'esper-ray[optuna]'"


@dataclass(frozen=True)
class SearchSettings:
    budget: int
    """Host runs (candidates tried) per host."""
    algorithm: str = "random"

    @classmethod
    def from_mapping(cls, value: Any, where: str) -> SearchSettings:
        example = "e.g. {budget: 16, algorithm: random}"
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}={value!r}: must be a mapping, {example}")
        unknown = sorted(set(value) - {"budget", "algorithm"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: ['algorithm', 'budget']")
        if "budget" not in value:
            raise ValueError(f"{where}: missing `budget` (host runs of the search per host), {example}")
        budget = value["budget"]
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_COUNT:
            raise ValueError(
                f"{where}.budget={budget!r}: must be an integer in [1, {MAX_COUNT:,}] (host runs per host)"
            )
        algorithm = value.get("algorithm", "random")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{where}.algorithm={algorithm!r}: choose one of {list(ALGORITHMS)}")
        return cls(budget, algorithm)

    def check_installed(self, where: str) -> None:
        """ValueError in one line where the algorithm needs a package this Python lacks (checked before a run starts;
        a report reads a run's settings without it)."""
        if self.algorithm in NEEDS_OPTUNA and importlib.util.find_spec("optuna") is None:
            raise ValueError(
                f"{where}.algorithm={self.algorithm!r}: needs optuna, which is not installed: {OPTUNA_EXTRA}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "algorithm": self.algorithm}
