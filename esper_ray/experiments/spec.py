"""An A/B experiment file (`tune_configs/*.yaml`): arms, shared seeds, rounds, resources, metric, alpha.

    name: shaped_vs_simplified
    arms:                           # each arm: a reward mode plus optional overrides of any training setting
      shaped: {reward_mode: shaped}
      simplified: {reward_mode: simplified}
    seeds: [0, 1, 2, 3, 4]          # one list, shared by every arm: same host init and data order per seed
    rounds: 20
    training: {task: digits-impaired, max_epochs: 20, envs: 1}   # settings common to all arms
    max_concurrent_trials: 4
    metric: final_accuracy          # or accuracy_per_param; never an arm's own reward
    last_rounds: 3                  # the metric averages the final episodes of this many last rounds
    alpha: 0.05
    order_seed: 7                   # optional: seed of the random start order (drawn and recorded if absent)
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from esper_ray.contracts.fields import check_keys
from esper_ray.contracts.train_config import TrainConfig

METRICS = ("final_accuracy", "accuracy_per_param")
SET_BY_EXPERIMENT = ("seed", "rounds", "output", "address")


@dataclass(frozen=True)
class TrialSpec:
    arm: str
    seed: int
    train: dict[str, Any]
    """TrainConfig settings of this trial."""

    @property
    def name(self) -> str:
        return f"{self.arm}_seed{self.seed}"


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    """Experiment name; results go to esper_runs/<name> unless --output says otherwise."""
    arms: Mapping[str, Mapping[str, Any]]
    """Arm name -> training settings that differ from `training` (at least a reward_mode)."""
    seeds: tuple[int, ...]
    """Seeds shared by every arm."""
    rounds: int = 10
    """Training rounds per trial."""
    training: Mapping[str, Any] = field(default_factory=dict)
    """Training settings common to every arm (TrainConfig keys: task, max_epochs, envs, resources, ...)."""
    max_concurrent_trials: int = 2
    """Trials running at once (as resources allow)."""
    metric: str = "final_accuracy"
    """final_accuracy (host validation accuracy at episode end) or accuracy_per_param (per 1,000 parameters)."""
    last_rounds: int = 3
    """The metric is the mean over the episodes of this many last rounds."""
    alpha: float = 0.05
    """Significance level of the verdict."""
    order_seed: int | None = None
    """Seed of the random trial start order; drawn and recorded when absent."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "arms", {str(k): dict(v or {}) for k, v in dict(self.arms).items()})
        object.__setattr__(self, "training", dict(self.training))
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r}: must be a non-empty folder name")
        if len(self.arms) < 2:
            raise ValueError(f"arms: an A/B experiment needs at least 2 arms, got {list(self.arms)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={list(self.seeds)}: need at least one seed and no repeats")
        if self.metric not in METRICS:
            raise ValueError(f"metric={self.metric!r}: choose one of {list(METRICS)} (an arm's own reward is never compared)")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha={self.alpha}: must be in (0, 1)")
        for name, minimum in (("rounds", 1), ("max_concurrent_trials", 1), ("last_rounds", 1)):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < minimum:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be an integer >= {minimum}")
        if self.last_rounds > self.rounds:
            raise ValueError(f"last_rounds={self.last_rounds} exceeds rounds={self.rounds}")
        for where, settings in [("training", self.training), *[(f"arms.{a}", s) for a, s in self.arms.items()]]:
            clash = sorted(set(settings) & set(SET_BY_EXPERIMENT))
            if clash:
                raise ValueError(f"{where}: {clash} are set by the experiment (seeds, rounds) or the command line (--output, --address)")
        for trial in self.trials():
            TrainConfig.from_mapping(trial.train)  # every trial's settings are valid before anything starts

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> ExperimentSpec:
        check_keys(cls, mapping, "experiment key")
        missing = sorted({"name", "arms", "seeds"} - set(mapping))
        if missing:
            raise ValueError(f"experiment file is missing {missing}")
        return cls(**dict(mapping))

    @classmethod
    def from_yaml(cls, path: str | Path) -> ExperimentSpec:
        file = Path(path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"experiment file {file} does not exist")
        data = yaml.safe_load(file.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{file}: expected a mapping at the top level")
        return cls.from_mapping(data)

    def trials(self) -> list[TrialSpec]:
        """Every (arm, seed), arm-major. Seeds are the same list in every arm."""
        out = []
        for arm, overrides in self.arms.items():
            env = {**dict(self.training.get("env", {})), **dict(overrides.get("env", {}))}
            settings = {**self.training, **overrides, "env": env, "rounds": self.rounds}
            for seed in self.seeds:
                out.append(TrialSpec(arm, seed, {**settings, "seed": seed}))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def draw_order_seed() -> int:
    return secrets.randbelow(2**31)


def start_order(trials: list[TrialSpec], order_seed: int) -> list[TrialSpec]:
    """A seeded random permutation of all trials: no arm systematically starts first or last."""
    permutation = np.random.default_rng(order_seed).permutation(len(trials))
    return [trials[i] for i in permutation]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
