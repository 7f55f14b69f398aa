"""An A/B experiment file (`tune_configs/*.yaml`): arms, shared seeds, rounds, resources, metric, alpha.

    name: controllers
    arms:                           # each arm: a controller and optional overrides of any training setting
      ppo: {controller: ppo, reward_mode: shaped}
      heuristic: {controller: heuristic}
      none: {controller: none}      # always WAIT: the host without growth
      heavy_r0c1:                   # born bigger: this seed planted at once, fossilized as early as allowed
        controller: fixed
        fixed: {blueprint: conv_heavy, slot: r0c1}   # optional: style (sigmoid_add), tempo (standard)
    seeds: [0, 1, 2, 3, 4, 5, 6, 7] # one list, shared by every arm: same host init, data order, eval episodes
    rounds: 20                      # PPO rounds per trial (baseline controllers do not train)
    training: {task: digits-impaired, max_epochs: 25, envs: 2}   # settings common to all arms
    max_concurrent_trials: 2        # optional: a cap (default: as many as the cluster's CPUs and GPUs fit)
    metric: test_accuracy           # held-out test accuracy of the final host over the evaluation episodes
    eval_episodes: 4
    alpha: 0.05
    order_seed: 7                   # optional: seed of the random start order (drawn and recorded if absent)
    compare: [[ppo, none], [ppo, heuristic]]   # optional: the pairs the verdict tests (default: every pair)
    held_out:                       # optional: evaluate every trial on these hosts instead (experiments/held_out.py)
      - {name: digits, env: {task: digits}}
    host_runs: 16                   # optional, with held_out: every arm at equal cost (experiments/equal_cost.py)
Two arm kinds exist only here: `controller: checkpoint` with `checkpoint: PATH` (a trained checkpoint's greedy
policy, evaluated without training; `{seed}` in PATH: each seed's own checkpoint) and `controller: search` with
`search: {budget: 16, algorithm: random}` (per host, a search over fixed plans: experiments/plan_search.py).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esper_ray.contracts import registry
from esper_ray.contracts.actions import Tempo, check_slot_count
from esper_ray.contracts.controllers import ControllerKind, FixedPlan, FixedSeed
from esper_ray.contracts.fields import check_int, check_keys
from esper_ray.contracts.slots import check_slots
from esper_ray.contracts.train_config import MAX_COUNT, MAX_ROUNDS, TrainConfig
from esper_ray.contracts.yaml_file import load_mapping
from esper_ray.experiments.folder_names import check_folder_name
from esper_ray.experiments.held_out import HeldOutHost, host_settings, parse_held_out
from esper_ray.experiments.search_settings import SearchSettings
from esper_ray.morpho.hosts import default_slots, host_slot_ids, topology_of
from esper_ray.policy.heuristic import TEMPO as HEURISTIC_TEMPO
from esper_ray.train.folders.checkpoints import LATEST_FILE
from esper_ray.train.rllib.rounds import MODULE_PATH

# Comparison metrics, all common to every arm (never an arm's own reward). "per_param" is per 1,000 parameters
# of the final grown model.
METRICS = ("test_accuracy", "test_accuracy_per_param", "rollout_accuracy", "rollout_accuracy_per_param")
SET_BY_EXPERIMENT = ("seed", "rounds", "output", "address")
SEED_FIELD = "{seed}"
ARM_ONLY_KEYS = ("controller", "fixed", "sweep_host_runs", "checkpoint", "search")
"""Arm keys that are not training settings; `sweep_host_runs`: the host runs of the sweep that picked a fixed arm's
seed (once for all seeds), shown in the report's cost table; `checkpoint`: the checkpoint a `checkpoint` arm evaluates;
`search`: a `search` arm's budget and algorithm."""
GPU_SETTINGS = ("gpus_per_env", "learner_gpus", "mps")
"""Training settings that put a trial on GPUs; on_cpus() takes them out."""
DEFAULT_LAST_ROUNDS = 3


@dataclass(frozen=True)
class TrialSpec:
    arm: str
    seed: int
    controller: ControllerKind
    train: dict[str, Any]
    """TrainConfig settings of this trial (its own copy)."""
    fixed: FixedPlan | None = None
    """The seed(s) a `fixed` controller plants (None for the other controllers)."""
    held_out: tuple[tuple[str, dict[str, Any]], ...] = ()
    """(host name, TrainConfig settings) of each held-out host the trial evaluates on; empty: on its own settings."""
    checkpoint: str | None = None
    """A `checkpoint` arm's checkpoint folder, absolute."""
    search: SearchSettings | None = None
    """A `search` arm's budget and algorithm."""
    host_runs: int | None = None
    """The experiment's `host_runs` (equal cost): its evaluation episodes per host are its host runs, a search's too."""

    @property
    def name(self) -> str:
        return f"{self.arm}_seed{self.seed}"


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    """Experiment name; results go to esper_runs/<name> unless --output says otherwise."""
    arms: Mapping[str, Mapping[str, Any]]
    """Arm name -> `controller` (ppo, heuristic, none, random, fixed, checkpoint or search; default ppo), for `fixed`
    the seed it plants (`fixed: {blueprint: conv_heavy, slot: r0c1}`), for `checkpoint` its `checkpoint: PATH`, for
    `search` its `search: {budget: N, algorithm: random}`, and the training settings that differ from `training` (a
    reward_mode, say)."""
    seeds: tuple[int, ...]
    """Seeds shared by every arm: seed s gives the same host initialisation, data order and evaluation episodes
    in every arm, so the arms are compared seed by seed (paired)."""
    rounds: int = 10
    """PPO training rounds per trial; baseline controllers do not train and only run the evaluation."""
    training: Mapping[str, Any] = field(default_factory=dict)
    """Training settings common to every arm (TrainConfig keys: task, max_epochs, envs, resources, ...)."""
    max_concurrent_trials: int | None = None
    """A cap on the trials running at once. None (the default): as many as the cluster's CPUs and GPUs fit
    (experiments/concurrency.py; Tune queues the rest), so a file runs unchanged on a laptop or four GPUs."""
    metric: str = "test_accuracy"
    """test_accuracy (default: the final host's accuracy on the held-out test split, mean over the evaluation
    episodes), test_accuracy_per_param (per 1,000 parameters), rollout_accuracy (validation accuracy at the end
    of the last `last_rounds` rounds' training rollouts) or rollout_accuracy_per_param."""
    eval_episodes: int = 4
    """Evaluation episodes per trial after its last round, identical across arms (greedy for PPO)."""
    last_rounds: int | None = None
    """rollout_* metrics: mean over the episodes of this many last rounds (default: min(3, rounds))."""
    alpha: float = 0.05
    """Significance level of the verdict."""
    max_failures: int = 1
    """Retries of a trial that raises (from its last checkpoint) before it is marked failed and excluded."""
    order_seed: int | None = None
    """Seed of the random trial start order; drawn and recorded when absent."""
    compare: tuple[tuple[str, str], ...] | None = None
    """The pairs of arms the verdict tests, as [A, B] lists: the family Holm corrects over, fixed before the run
    (e.g. the learned controller against each baseline). Default: every pair of arms."""
    held_out: Any = None
    """Hosts no arm trains on, where every trial is evaluated instead: a list of {name, env} (env: EnvConfig
    overrides such as task, host_preset, max_epochs) or a registered host family's name (experiments/held_out.py).
    The metric is then reported per host and as the mean over the hosts (the trial's metric)."""
    host_runs: int | None = None
    """With `held_out`: every arm spends this many host runs per held-out host, run i on evaluation episode i in every
    arm, and keeps the network its own validation picks (experiments/equal_cost.py); they are its evaluation episodes
    (eval_episodes is host_runs) and a search arm's candidates (its budget is host_runs). The metric is then the
    test score of the run best by validation of all host_runs; the report reads every k = 1, 2, 4, ..., host_runs."""

    def __post_init__(self) -> None:
        check_folder_name("name", self.name)
        if not isinstance(self.arms, Mapping) or not all(
            isinstance(v, Mapping) or v is None for v in self.arms.values()
        ):
            raise ValueError(
                f"arms={self.arms!r}: must map each arm name to its settings, e.g. {{ppo: {{controller: ppo}}}}"
            )
        for arm in self.arms:
            check_folder_name(f"arms.{arm}", arm, "arm name")
        if (
            isinstance(self.seeds, (str, bytes))
            or not isinstance(self.seeds, (list, tuple))
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds)
        ):
            raise ValueError(f"seeds={self.seeds!r}: must be a list of integers >= 0, e.g. [0, 1, 2, 3, 4, 5, 6, 7]")
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "arms", {str(k): copy.deepcopy(dict(v or {})) for k, v in self.arms.items()})
        if not isinstance(self.training, Mapping):
            raise ValueError(f"training={self.training!r}: must be a mapping of training settings")
        object.__setattr__(self, "training", copy.deepcopy(dict(self.training)))
        if len(self.arms) < 2:
            raise ValueError(f"arms: an A/B experiment needs at least 2 arms, got {list(self.arms)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={list(self.seeds)}: need at least one seed and no repeats")
        if self.metric not in METRICS:
            raise ValueError(
                f"metric={self.metric!r}: choose one of {list(METRICS)} (an arm's own reward is never compared)"
            )
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < 1:
            raise ValueError(f"alpha={self.alpha!r}: must be a number in (0, 1)")
        for name, minimum, maximum in (
            ("rounds", 1, MAX_ROUNDS),
            ("eval_episodes", 1, MAX_COUNT),
            ("max_failures", 0, MAX_COUNT),
        ):
            check_int(name, getattr(self, name), minimum, maximum)
        if self.max_concurrent_trials is not None:
            check_int("max_concurrent_trials", self.max_concurrent_trials, 1)
        if self.last_rounds is not None:
            check_int("last_rounds", self.last_rounds, 1)
        if self.order_seed is not None and (
            isinstance(self.order_seed, bool) or not isinstance(self.order_seed, int) or self.order_seed < 0
        ):
            raise ValueError(f"order_seed={self.order_seed!r}: must be an integer >= 0 (or left out)")
        if self.rollout_rounds > self.rounds:
            raise ValueError(
                f"last_rounds={self.last_rounds} exceeds rounds={self.rounds}: give at most {self.rounds}, "
                f"or leave it out (default: min({DEFAULT_LAST_ROUNDS}, rounds))"
            )
        for where, settings in [("training", self.training), *[(f"arms.{a}", s) for a, s in self.arms.items()]]:
            clash = sorted(set(settings) & set(SET_BY_EXPERIMENT))
            if clash:
                raise ValueError(
                    f"{where}: {clash} are set by the experiment (seeds, rounds) "
                    "or the command line (--output, --address)"
                )
            if "env" in settings and not isinstance(settings["env"], Mapping):
                raise ValueError(f"{where}.env={settings['env']!r}: must be a mapping of env settings")
        if "controller" in self.training:
            raise ValueError("training: `controller` is chosen per arm (arms.<name>.controller), not for all arms")
        for arm, settings in self.arms.items():
            kind = ControllerKind.parse(settings.get("controller", ControllerKind.PPO.value), f"arms.{arm}.controller")
            if "sweep_host_runs" in settings:
                check_int(f"arms.{arm}.sweep_host_runs", settings["sweep_host_runs"], 0)
            for key, own in (("checkpoint", ControllerKind.CHECKPOINT), ("search", ControllerKind.SEARCH)):
                if kind is own and key not in settings:
                    raise ValueError(
                        f"arms.{arm}: a `controller: {own.value}` arm needs `{key}`, e.g. {_ARM_EXAMPLES[key]}"
                    )
                if kind is not own and key in settings:
                    raise ValueError(
                        f"arms.{arm}: `{key}` belongs to a `controller: {own.value}` arm; this arm's "
                        f"controller is {kind.value}"
                    )
            if kind is ControllerKind.CHECKPOINT and (
                not isinstance(settings["checkpoint"], str) or not settings["checkpoint"]
            ):
                raise ValueError(
                    f"arms.{arm}.checkpoint={settings['checkpoint']!r}: must be the path of a trained "
                    "checkpoint folder (relative to where `esper-ray ab` runs, or absolute; "
                    f"{SEED_FIELD} in it stands for each trial's seed)"
                )
            if kind is ControllerKind.CHECKPOINT and re.search(r"[{}]", settings["checkpoint"].replace(SEED_FIELD, "")):
                raise ValueError(
                    f"arms.{arm}.checkpoint={settings['checkpoint']!r}: the only field a checkpoint path "
                    f"may hold is {SEED_FIELD} (each trial's seed), and no other brace"
                )
            if kind is ControllerKind.SEARCH:
                SearchSettings.from_mapping(settings["search"], f"arms.{arm}.search")
            if (kind is ControllerKind.FIXED) != ("fixed" in settings):
                raise ValueError(
                    f"arms.{arm}: `fixed` names the seed of a fixed controller, e.g. controller: fixed, "
                    f"fixed: {{blueprint: conv_heavy, slot: r0c1}}; this arm's controller is {kind.value}"
                    + (" and it has none" if kind is ControllerKind.FIXED else "")
                )
        object.__setattr__(self, "compare", self._checked_compare())
        self._check_host_runs()
        self._check_trials()

    def _check_host_runs(self) -> None:
        """`host_runs`: with held-out hosts and a test metric; then every host run is an evaluation episode and a
        search's candidate (ExperimentSpec.host_runs)."""
        if self.host_runs is None:
            return
        check_int("host_runs", self.host_runs, 1, MAX_COUNT)
        if self.held_out is None:
            raise ValueError(
                f"host_runs={self.host_runs}: counts host runs per held-out host; give `held_out` too, or leave it out"
            )
        if not self.metric.startswith("test_"):
            raise ValueError(
                f"host_runs with metric={self.metric!r}: a host run is scored on its test split; choose one of "
                f"{[m for m in METRICS if m.startswith('test_')]}"
            )
        for arm in self.arms:
            search = self.search_settings(arm)
            if search is not None and search.budget != self.host_runs:
                raise ValueError(
                    f"arms.{arm}.search.budget={search.budget}: with host_runs={self.host_runs} a search's candidates "
                    f"are its host runs; give budget {self.host_runs}"
                )
        object.__setattr__(self, "eval_episodes", self.host_runs)  # every host run is an evaluation episode

    def _check_trials(self) -> None:
        """Every trial's settings as a run builds them (TrainConfig, which imports the plug-ins they name), before
        anything starts."""
        for arm in self.arms:  # a run needs its search's package; a report of it does not (RecordedExperiment)
            search = self.search_settings(arm)
            if search is not None:
                search.check_installed(f"arms.{arm}.search")
        if self.held_out is not None:
            for settings in (self.training, *self.arms.values()):  # a plug-in's family may be the held-out one
                plugins = settings.get("plugins", ())
                registry.load_plugins(plugins if isinstance(plugins, (list, tuple)) else ())
            parse_held_out(self.held_out)  # raises naming the entry
            object.__setattr__(self, "held_out", _plain(copy.deepcopy(self.held_out)))
        for trial in self.trials():
            cfg = TrainConfig.from_mapping(trial.train)  # every trial's settings are valid before anything starts
            if cfg.family is None:
                where = f"arms.{trial.arm}.slots" if "slots" in self.arms[trial.arm] else "training.slots"
                try:
                    check_slot_count(cfg.host_name, len(check_slots(list(cfg.slots), host_slot_ids(cfg.host_name))))
                except ValueError as err:
                    raise ValueError(f"{where}={list(cfg.slots)}: {err} (host {cfg.host_name})") from None
            for host, settings in trial.held_out:
                try:
                    TrainConfig.from_mapping(settings)
                except ValueError as err:
                    raise ValueError(f"held_out host {host!r} (arm {trial.arm}): {err}") from None
            if cfg.lead:  # a runner never leads into the round after a save, and a trial saves after every round
                raise ValueError(
                    f"arms.{trial.arm}: lead=true does nothing in an A/B (Tune checkpoints a trial "
                    "after every round, and no env runner leads past a checkpoint); leave it out"
                )

    def _checked_compare(self) -> tuple[tuple[str, str], ...] | None:
        if self.compare is None:
            return None
        example = "e.g. [[ppo, none], [ppo, heuristic]]"
        if isinstance(self.compare, (str, bytes)) or not isinstance(self.compare, (list, tuple)) or not self.compare:
            raise ValueError(f"compare={self.compare!r}: must be a non-empty list of [A, B] arm pairs, {example}")
        pairs = []
        for pair in self.compare:
            if isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"compare: {pair!r} is not a pair [A, B] of arms, {example}")
            unknown = [a for a in pair if a not in self.arms]
            if unknown:
                raise ValueError(
                    f"compare: {pair!r} names {unknown}, not arms of this experiment; arms: {list(self.arms)}"
                )
            if pair[0] == pair[1] or (pair[0], pair[1]) in pairs or (pair[1], pair[0]) in pairs:
                raise ValueError(f"compare: {pair!r} compares an arm with itself or repeats a pair")
            pairs.append((str(pair[0]), str(pair[1])))
        return tuple(pairs)

    @property
    def compared_pairs(self) -> list[tuple[str, str]]:
        """The verdict's family of pairs: `compare`, or every pair of arms in arm order."""
        return list(self.compare) if self.compare is not None else list(itertools.combinations(self.arms, 2))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> ExperimentSpec:
        check_keys(cls, mapping, "experiment key")
        missing = sorted({"name", "arms", "seeds"} - set(mapping))
        if missing:
            raise ValueError(f"experiment file is missing {missing}")
        runs, episodes = mapping.get("host_runs"), mapping.get("eval_episodes")
        if runs is not None and episodes is not None and episodes != runs:
            raise ValueError(
                f"eval_episodes={episodes!r} with host_runs={runs!r}: every host run is an evaluation episode; "
                "leave eval_episodes out"
            )
        return cls(**dict(mapping))

    @classmethod
    def from_yaml(cls, path: str | Path) -> ExperimentSpec:
        data = load_mapping(path, "experiment file")
        try:
            return cls.from_mapping(data)
        except ValueError as err:
            raise ValueError(f"{Path(path).expanduser()}: {err}") from None

    @property
    def rollout_rounds(self) -> int:
        """The rounds the rollout_* metrics average over: `last_rounds`, or min(3, rounds) when it is not given
        (a fixed 3 would refuse a one-round experiment for a setting its file never wrote)."""
        return self.last_rounds if self.last_rounds is not None else min(DEFAULT_LAST_ROUNDS, self.rounds)

    def controller(self, arm: str) -> ControllerKind:
        return ControllerKind.parse(
            self.arms[arm].get("controller", ControllerKind.PPO.value), f"arms.{arm}.controller"
        )

    def fixed_plan(self, arm: str) -> FixedPlan | None:
        """The seed(s) arm `arm` plants, if its controller is `fixed` (checked against its task and slots)."""
        settings = self.arms[arm]
        if "fixed" not in settings:
            return None
        train = TrainConfig.from_mapping(self._arm_settings(arm))
        return FixedPlan.from_mapping(
            settings["fixed"], f"arms.{arm}.fixed", topology=topology_of(train.task, train.host_name), slots=train.slots
        )

    @property
    def held_out_hosts(self) -> tuple[HeldOutHost, ...]:
        """The held-out hosts (none without `held_out`)."""
        return parse_held_out(self.held_out) if self.held_out is not None else ()

    def search_settings(self, arm: str) -> SearchSettings | None:
        settings = self.arms[arm]
        return SearchSettings.from_mapping(settings["search"], f"arms.{arm}.search") if "search" in settings else None

    def checkpoint_path(self, arm: str, seed: int) -> str | None:
        """A `checkpoint` arm's checkpoint for `seed`, absolute (a Tune trial runs in its own folder); `{seed}` in the
        path stands for the trial's seed, so each seed evaluates its own controller (paired with the other arms')."""
        path = self.arms[arm].get("checkpoint")
        return str(Path(path.replace(SEED_FIELD, str(seed))).expanduser().resolve()) if path is not None else None

    def short_run_warnings(self) -> list[str]:
        """TrainConfig.short_run_warning of each arm that plants seeds, on its own settings and on each held-out host,
        as `arm A[ on host H]: line` (arms and hosts with the same line in one): for a fixed or search arm about its
        plans' tempo, for the heuristic about its own, otherwise about any seed. `esper-ray ab` prints them and
        the report repeats them: such an arm ties with no growth, and a plan it names was never planted."""
        where: dict[str, list[str]] = {}
        for trial in self.trials():
            if trial.seed != self.seeds[0] or trial.controller is ControllerKind.NONE:
                continue  # an arm's trials differ only in their seed; no growth plants nothing
            tempo = _planting_tempo(trial)
            for host, settings in [(None, trial.train), *trial.held_out]:
                cfg = TrainConfig.from_mapping(settings)  # no seed at all, or else none at the arm's tempo
                line = cfg.short_run_warning() or (cfg.short_run_warning(tempo) if tempo is not None else None)
                if line is not None:
                    where.setdefault(line, []).append(f"arm {trial.arm}" + (f" on host {host}" if host else ""))
        return [f"{', '.join(names)}: {line}" for line, names in where.items()]

    def arm_setting(self, arm: str, name: str) -> Any:
        """A training setting of `arm`'s trials as the file states it, or TrainConfig's default: read, no TrainConfig
        built (building one imports the plug-ins the settings name; a report imports none)."""
        return self._arm_settings(arm).get(name, TrainConfig.default(name))

    def arm_envs(self, arm: str) -> int:
        """The envs each round of `arm`'s training steps, each an episode source, however split into runners."""
        return int(self.arm_setting(arm, "envs"))

    def check_checkpoints(self) -> None:
        """Every `checkpoint` arm's folder, for every seed, is a checkpoint folder: one ValueError naming the arm, the
        seed and the path, before anything starts (Ray's start takes a minute on a busy machine). Not in __post_init__:
        a finished run's report is rebuilt from its spec where its checkpoints may be gone."""
        for arm in self.arms:
            for seed in self.seeds if self.controller(arm) is ControllerKind.CHECKPOINT else ():
                path = Path(self.checkpoint_path(arm, seed))  # type: ignore[arg-type]
                given = self.arms[arm]["checkpoint"]
                where = f"arms.{arm}.checkpoint={given!r}" + (f" (seed {seed})" if SEED_FIELD in given else "")
                problem = checkpoint_folder_problem(path)
                if problem is not None:
                    raise ValueError(f"{where}: {path} {problem}")

    @property
    def asks_for_gpus(self) -> bool:
        """Whether any trial puts its envs or learner on a GPU (a GPU share, or an env device cuda)."""
        for arm in self.arms:  # an arm's trials differ only in their seed
            settings = self._arm_settings(arm)
            cfg = TrainConfig.from_mapping(settings)
            if cfg.gpus_per_env > 0 or cfg.learner_gpus > 0 or _on_cuda(settings["env"]):
                return True
        return False

    def on_cpus(self) -> ExperimentSpec:
        """The same experiment with every env and learner on the CPUs: the GPU shares, MPS and a cuda env device
        taken out of `training` and of every arm. What `esper-ray ab` runs where a file asks for GPUs and the
        machine has none (runner.py); everything else, the CPUs each trial asks for included, is unchanged."""

        def without_gpus(settings: Mapping[str, Any]) -> dict[str, Any]:
            out = {k: copy.deepcopy(v) for k, v in settings.items() if k not in GPU_SETTINGS}
            if _on_cuda(out.get("env", {})):
                out["env"] = {k: v for k, v in out["env"].items() if k != "device"}  # auto: the CPU here
            return out

        return dataclasses.replace(
            self,
            training=without_gpus(self.training),
            arms={arm: without_gpus(settings) for arm, settings in self.arms.items()},
        )

    def trials(self) -> list[TrialSpec]:
        """Every (arm, seed), arm-major. Seeds are the same list in every arm; every trial owns its settings."""
        out = []
        hosts = self.held_out_hosts
        for arm in self.arms:
            settings, fixed = self._arm_settings(arm), self.fixed_plan(arm)
            search = self.search_settings(arm)
            for seed in self.seeds:
                train = copy.deepcopy({**settings, "seed": seed})
                held_out = tuple((h.name, host_settings(train, h)) for h in hosts)
                out.append(
                    TrialSpec(
                        arm,
                        seed,
                        self.controller(arm),
                        train,
                        fixed,
                        held_out,
                        self.checkpoint_path(arm, seed),
                        search,
                        self.host_runs,
                    )
                )
        return out

    def _arm_settings(self, arm: str) -> dict[str, Any]:
        """The arm's TrainConfig settings, less the seed: `training` with the arm's overrides (env merged)."""
        overrides = {k: v for k, v in self.arms[arm].items() if k not in ARM_ONLY_KEYS}
        env = {**dict(self.training.get("env", {})), **dict(overrides.get("env", {}))}
        settings = {**self.training, **overrides, "env": env, "rounds": self.rounds}
        if "slots" not in settings and settings.get("family") is None:  # a family's members name their own
            slots = self._host_default_slots(settings)
            if slots is not None:
                settings["slots"] = slots
        return settings

    def _host_default_slots(self, settings: Mapping[str, Any]) -> list[str] | None:
        return _host_default_slots(settings)

    def to_dict(self) -> dict[str, Any]:
        """The settings, `last_rounds` as used (so a record says what was averaged, and reads back the same)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["last_rounds"] = self.rollout_rounds
        return out


SHORT_RUN_WARNINGS_KEY = "short_run_warnings"
HELD_OUT_HOSTS_KEY = "held_out_hosts"
"""experiment.json keys `esper-ray ab` writes beside the experiment (runner.plan), for the report to read as data."""


@dataclass(frozen=True)
class RecordedExperiment(ExperimentSpec):
    """An experiment as a run folder's experiment.json records it, read for `esper-ray report`: JSON only. Nothing it
    names is imported or resolved (no plug-in, no `task: mod:fn` or `host_preset: mod:Cls`, no registry lookup of a
    host); what only a built TrainConfig would check was checked when the run started, and a fixed arm's plan is
    read without its host (any blueprint name the policy knows, any slot). A copied folder is data, whoever wrote it."""

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RecordedExperiment:
        """From experiment.json as a whole: `experiment`, and what `esper-ray ab` worked out when it started (the
        held-out hosts a family name stood for, the short-run warnings it printed), which the report reads as data."""
        spec = cls.from_mapping(record["experiment"])
        object.__setattr__(spec, "_record", dict(record))
        return spec

    def _recorded(self, key: str) -> Any:
        return getattr(self, "_record", {}).get(key)

    def short_run_warnings(self) -> list[str]:
        """The lines `esper-ray ab` printed when the run started (experiment.json; none in runs before it recorded
        them): working them out again would build each arm's TrainConfig, which imports the plug-ins it names."""
        recorded = self._recorded(SHORT_RUN_WARNINGS_KEY)
        return [str(line) for line in recorded] if isinstance(recorded, list) else []

    def _check_trials(self) -> None:
        if self.held_out is not None and not isinstance(self.held_out, str):
            parse_held_out(self.held_out)  # a list of {name, env}: plain data
            object.__setattr__(self, "held_out", _plain(copy.deepcopy(self.held_out)))

    @property
    def held_out_hosts(self) -> tuple[HeldOutHost, ...]:
        recorded = self._recorded(HELD_OUT_HOSTS_KEY)
        if recorded is not None:  # the hosts a family name stood for when the run started: plain data
            return parse_held_out(recorded)
        try:
            return super().held_out_hosts  # a family name: the families this process registered, built-in ones
        except ValueError as err:
            raise ValueError(
                f"{err}; `esper-ray report` imports no plug-in a run folder names, so a plug-in's family "
                "is not known to it"
            ) from None

    def _host_default_slots(self, settings: Mapping[str, Any]) -> list[str] | None:
        return None  # finding them imports the host's plug-in; a report reads no slot the file does not state

    def fixed_plan(self, arm: str) -> FixedPlan | None:
        settings = self.arms[arm]
        if "fixed" not in settings:
            return None
        return FixedPlan.from_mapping(settings["fixed"], f"arms.{arm}.fixed", topology=None, slots=None)


def _planting_tempo(trial: TrialSpec) -> Tempo | None:
    """The fastest tempo a trial's controller plants at: its fixed plan's, a search's candidates' (FixedSeed's
    default, plan_search.candidate_plans), the heuristic's own; None for a controller that may take any."""
    if trial.fixed is not None:
        return min((s.tempo for s in trial.fixed.seeds), key=lambda t: t.epochs)
    if trial.controller is ControllerKind.SEARCH:
        return FixedSeed.tempo
    return HEURISTIC_TEMPO if trial.controller is ControllerKind.HEURISTIC else None


CHECKPOINT_HINT = (
    "give a checkpoint folder: one that `esper-ray train` wrote (RUN/checkpoints/round_NNNNN) or an A/B PPO "
    "trial's, relative to where `esper-ray ab` runs, or absolute"
)


def checkpoint_folder_problem(path: Path) -> str | None:
    """What keeps `path` from being a checkpoint a `checkpoint` arm evaluates (None: nothing). Reads folder names only:
    a checkpoint's pickles load in its trial (and import Ray)."""
    if not path.exists():
        return f"does not exist; {CHECKPOINT_HINT}"
    if not path.is_dir():
        return f"is a file, not a folder; {CHECKPOINT_HINT}"
    if (path / MODULE_PATH).is_dir():
        return None
    latest = path / "checkpoints" / LATEST_FILE
    if latest.is_file():
        return (
            f"is a training run's folder, not one of its checkpoints; give one of {path / 'checkpoints'}/round_NNNNN "
            f"(its newest is named in {latest})"
        )
    return f"is not a checkpoint folder (no {MODULE_PATH} in it); {CHECKPOINT_HINT}"


_ARM_EXAMPLES = {
    "checkpoint": "controller: checkpoint, checkpoint: esper_runs/train/checkpoints/round_00020",
    "search": "controller: search, search: {budget: 16, algorithm: random}",
}


def _host_default_slots(settings: Mapping[str, Any]) -> list[str] | None:
    """The slots of an arm that names none, where TrainConfig's default does not fit its host (a plug-in's host):
    every slot the host declares (morpho/hosts.py default_slots). None: the default fits, or the settings are bad
    (TrainConfig's own check then names the setting)."""
    default = TrainConfig.default("slots")
    try:
        plugins = settings.get("plugins", ())
        registry.load_plugins(plugins if isinstance(plugins, (list, tuple)) else ())
        env = settings.get("env", {})
        host = env.get("host_preset") or registry.task(settings.get("task", TrainConfig.default("task"))).hosts[0]
        slots = default_slots(host, default)
    except (ValueError, TypeError, IndexError, AttributeError):
        return None
    return list(slots) if slots != tuple(default) else None


def _on_cuda(env: Mapping[str, Any]) -> bool:
    """Whether env settings name a CUDA device (cuda, cuda:N)."""
    return str(env.get("device", "")).startswith("cuda")


def draw_order_seed() -> int:
    return secrets.randbelow(2**31)


def start_order(trials: list[TrialSpec], order_seed: int) -> list[TrialSpec]:
    """The PPO trials, then the others, each kind in a seeded random permutation: among trials of one kind no arm
    systematically starts first or last, and the longest trials (a PPO trial trains for its rounds; the others run
    only their evaluation episodes) start at once, so the run ends about when they do, not after the short trials
    held the GPUs first (text.yaml at 15 rounds, 2 x H200, all in random order: the last PPO trial started at 103 s
    and the report came at 310 s, where its 15 rounds took 178 s; docs/performance.md)."""
    permutation = np.random.default_rng(order_seed).permutation(len(trials))
    return sorted((trials[i] for i in permutation), key=lambda t: t.controller is not ControllerKind.PPO)  # stable


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
