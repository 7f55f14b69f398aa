"""Read a (finished, partial or interrupted) A/B run back from disk: each planned trial, its status, its
per-round history, its evaluation, and its comparison metric.

Only trials that finished (every round and the evaluation, no error) enter the statistics; the others are
listed with their status: `error` (raised, retries used up), `incomplete` (stopped part-way) or `not started`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esper_ray.contracts.controllers import ControllerKind
from esper_ray.experiments.continuation import continued_rows, links_of
from esper_ray.experiments.equal_cost import RUNS, runs_from_json
from esper_ray.experiments.held_out import host_key
from esper_ray.experiments.spec import ExperimentSpec, RecordedExperiment
from esper_ray.experiments.trial_keys import EVAL_PREFIX, SUMMARY_PREFIX, TRIAL_KEY, per_kparam
from esper_ray.experiments.trial_split import SPLIT_KEY, recorded_split, with_split
from esper_ray.experiments.tune_folder import TuneTrial, number, read_results, read_trials

TUNE_DIR = "tune"
SALVAGED_PREFIX = "tune_salvaged_"
"""tune/ folders `esper-ray ab --resume --salvage` set aside (tune_salvaged_1, _2, ...): only the JSON results of
their finished trials are read again."""
EXPERIMENT_FILE = "experiment.json"
ON_CPUS_KEY = "envs_on_cpus"
"""In experiment.json: true when the file asked for GPUs, the machine had none, and every trial ran on the CPUs."""
SEARCH_PLAN = "search_plan"
"""Per held-out host, the plan a search trial picked (trainable.SEARCH_PLAN; a string in its result)."""
HISTORY_COLUMNS = ("final_accuracy", "params_added", "host_params", "episode_return", "episodes", "seconds")
OPTIONAL_HISTORY_COLUMNS = ("final_accuracy_with_probation", "fossilized", "germinated", "pruned")
"""Per round, NaN in runs made before they were recorded."""
BY_BLUEPRINT = "by_blueprint"
"""History keys `by_blueprint/germinated_attention` (seeds per episode by outcome and blueprint), where recorded."""
EVAL_COLUMNS = (
    "episodes",
    "test_accuracy",
    "test_accuracy_std",
    "test_accuracy_per_param",
    "val_accuracy",
    "val_accuracy_per_param",
    "params_added",
    "host_params",
    "fossilized",
    "germinated",
)
COMPUTE_COLUMNS = (
    "final_params",
    "refused",
    "train_flops",
    "seed_train_flops",
    "validation_flops",
    "counterfactual_flops",
    "seconds",
)
"""Size and compute of the evaluation episodes (means per episode); NaN in runs made before they were recorded."""
PROBATION_COLUMNS = ("test_accuracy_with_probation", "val_accuracy_with_probation", "params_on_probation")
"""The evaluation episodes' accuracy with the seeds still on probation in, and their parameters (the metric scores the
committed model without them); NaN in runs made before the committed model."""
LOSS_COLUMNS = ("test_loss", "test_perplexity")
"""Held-out test loss (mean over the evaluation episodes) and exp of it; NaN in runs made before they were recorded."""
FINISHED, ERROR, INCOMPLETE, NOT_STARTED = "finished", "error", "incomplete", "not started"
NOT_PLANTED, NOT_KEPT = "not planted", "not kept"
"""TrialResult.plan_note: a fixed or searched plan that no evaluation episode planted, or planted and never kept."""
TRIAL_DIR_RE = re.compile(r"^(.+)_seed(\d+)_[0-9a-f]+_\d+$")  # runner._trial_name: {arm}_seed{seed}_{trial_id}


@dataclass
class TrialResult:
    arm: str
    seed: int
    position: int
    """Place in the planned start order."""
    controller: ControllerKind
    status: str
    error: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    """One row per PPO round (none for baseline controllers): the training rollouts' figures."""
    evaluation: dict[str, float] | None = None
    """Means over the held-out evaluation episodes (present once the trial finished its evaluation)."""
    started_at: float = math.nan
    """Wall-clock time of the trial's first result minus its duration (Unix seconds)."""
    plans: dict[str, str] = field(default_factory=dict)
    """A search trial's chosen plan per held-out host (`conv_heavy@r0c1`)."""
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """At equal cost (`host_runs`), per held-out host the trial's host runs in order (equal_cost.py): episode seed,
    validation and test score, a search's plan."""
    ran_in: list[str] = field(default_factory=list)
    """The run's Tune folders its results come from, oldest first: `tune`, or a folder --salvage set aside, or
    both for a trial continued from a killed run's checkpoint."""

    def rollout_curve(self, per_param: bool) -> list[float]:
        """Per round: final validation accuracy of the training rollouts (per 1,000 parameters if asked)."""
        if per_param:
            return [per_kparam(r["final_accuracy"], int(r["host_params"] + r["params_added"])) for r in self.history]
        return [r["final_accuracy"] for r in self.history]

    def host_value(self, column: str, host: str) -> float:
        """A figure of one held-out host (`test_accuracy` there, `host_runs`), NaN when the trial has none there."""
        return (self.evaluation or {}).get(host_key(column, host), math.nan)

    def plan_note(self, host: str | None = None) -> str | None:
        """What the evaluation episodes (on `host`, or on the trial's own settings) did with the seeds a fixed plan
        names: 'not planted' where no episode planted one (a deadline or commit_horizon left no room for its
        tempo), 'not kept' where none was fossilized; None where one was kept, or the run did not record it."""
        if host is None:
            germinated, fossilized = (
                (self.evaluation or {}).get("germinated", math.nan),
                (self.evaluation or {}).get("fossilized", math.nan),
            )
        else:
            germinated, fossilized = self.host_value("germinated", host), self.host_value("fossilized", host)
        if germinated == 0:
            return NOT_PLANTED
        return NOT_KEPT if fossilized == 0 else None

    def metric(self, name: str, last_rounds: int) -> float:
        """The comparison metric, NaN when the trial has none (yet)."""
        if self.evaluation is None:
            return math.nan
        if name.startswith("test_"):
            return self.evaluation[name]
        per_param = name.endswith("_per_param")
        if self.controller is not ControllerKind.PPO:  # nothing trained: its evaluation episodes are its rollouts
            return self.evaluation["val_accuracy_per_param" if per_param else "val_accuracy"]
        # the last `last_rounds` rounds by number (the history holds each round once: tune_folder.read_results)
        newest = max((r["round"] for r in self.history), default=0.0)
        curve = zip(self.history, self.rollout_curve(per_param))
        values = [v for r, v in curve if r["round"] > newest - last_rounds and math.isfinite(v)]
        return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class ExperimentRecord:
    spec: ExperimentSpec
    order_seed: int
    order_seed_drawn: bool
    trials: list[TrialResult]
    source: str | None = None
    """The experiment file the run was started from."""
    on_cpus: bool = False
    """The file asked for GPUs and every trial ran on the CPUs (ON_CPUS_KEY)."""
    split: dict[str, int] = field(default_factory=dict)
    """Each PPO arm's envs_per_runner as its trials ran (trial_split.py)."""

    @property
    def excluded(self) -> list[TrialResult]:
        return [t for t in self.trials if t.status != FINISHED]


def read_experiment_file(output: Path) -> dict[str, Any]:
    path = output / EXPERIMENT_FILE
    if not output.is_dir():
        raise FileNotFoundError(
            f"{output} is not a folder: give the run folder `esper-ray ab` wrote (it holds {EXPERIMENT_FILE})"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{output} holds no {EXPERIMENT_FILE}: it is not an `esper-ray ab` run folder")
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"{path}: not valid JSON ({type(err).__name__}: {err}); the run folder is damaged") from None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("experiment"), dict)
        or not isinstance(record.get("start_order"), list)
        or not all(isinstance(p, dict) and {"arm", "seed"} <= set(p) for p in record["start_order"])
    ):
        raise ValueError(
            f"{path}: not the record `esper-ray ab` writes (experiment, start_order of arms and seeds, ...)"
        )
    return record


def _history_and_evaluation(
    results: list[dict[str, Any]],
) -> tuple[list[dict[str, float]], dict[str, float] | None, float, dict[str, str], dict[str, list[dict[str, Any]]]]:
    """Per-round history (each round once), the evaluation (with its per-host figures, `test_accuracy/<host>`),
    the start time of a trial's results, a search trial's plans per host, and at equal cost the host runs per host."""
    plans: dict[str, str] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    if not results:
        return [], None, math.nan, plans, runs
    history: list[dict[str, float]] = []
    evaluation = None
    for row in results:
        if SUMMARY_PREFIX + "final_accuracy" in row and math.isfinite(number(row.get(SUMMARY_PREFIX + "round"))):
            entry = {"round": number(row[SUMMARY_PREFIX + "round"])}
            entry.update({c: number(row.get(SUMMARY_PREFIX + c)) for c in HISTORY_COLUMNS + OPTIONAL_HISTORY_COLUMNS})
            by_blueprint = row.get(SUMMARY_PREFIX + "by_blueprint")  # seeds per episode by outcome and blueprint
            if isinstance(by_blueprint, dict):
                entry.update({f"{BY_BLUEPRINT}/{k}": number(v) for k, v in by_blueprint.items()})
            history.append(entry)
        # an evaluation with no episode is one a fixed plan no held-out host could take: it happened, all n/a
        if (
            math.isfinite(number(row.get(EVAL_PREFIX + "test_accuracy")))
            or number(row.get(EVAL_PREFIX + "episodes")) == 0
        ):
            evaluation = {
                c: number(row.get(EVAL_PREFIX + c))
                for c in EVAL_COLUMNS + LOSS_COLUMNS + COMPUTE_COLUMNS + PROBATION_COLUMNS + ("host_runs",)
            }
            for key, value in row.items():  # per held-out host: eval/<figure>/<host>
                figure = key[len(EVAL_PREFIX) :] if key.startswith(EVAL_PREFIX) else ""
                if figure.startswith(SEARCH_PLAN + "/") and isinstance(value, str):
                    plans[figure.split("/", 1)[1]] = value
                elif figure.startswith(RUNS + "/"):
                    host_runs = runs_from_json(value)
                    if host_runs is not None:
                        runs[figure.split("/", 1)[1]] = host_runs
                elif "/" in figure:
                    evaluation[figure] = number(value)
    first = results[0]
    return history, evaluation, number(first.get("timestamp")) - number(first.get("time_this_iter_s")), plans, runs


def tune_folders(output: Path) -> list[Path]:
    """The run's Tune folders, oldest first: those set aside by --salvage, then tune/ (which may not exist)."""
    salvaged = [
        p for p in output.glob(SALVAGED_PREFIX + "*") if p.name[len(SALVAGED_PREFIX) :].isdigit() and p.is_dir()
    ]
    return sorted(salvaged, key=lambda p: int(p.name[len(SALVAGED_PREFIX) :])) + [output / TUNE_DIR]


def collect_trials(output: Path) -> ExperimentRecord:
    """Every planned trial of the run in `output`, whatever state the run is in. Reads JSON and text only: no
    pickle of the run folder is loaded (tune_folder.py), and no plug-in or import string it names is imported
    (RecordedExperiment). A trial is taken from tune/, or from a folder --salvage set aside if it finished there (it
    was not run again)."""
    record = read_experiment_file(output)
    spec = RecordedExperiment.from_record(record)  # data: imports and resolves nothing it names
    found: dict[tuple[str, int], TrialResult] = {}
    positions = {(p["arm"], int(p["seed"])): i for i, p in enumerate(record["start_order"])}
    for folder in tune_folders(output):
        for trial in read_trials(folder):
            result = _trial_result(output, spec, positions, trial)
            if result is not None and (folder.name == TUNE_DIR or result.status == FINISHED):
                found[(result.arm, result.seed)] = result
    trials = []
    for position, planned in enumerate(record["start_order"]):
        key = (planned["arm"], int(planned["seed"]))
        trials.append(
            found.get(key)
            or TrialResult(
                arm=key[0], seed=key[1], position=position, controller=spec.controller(key[0]), status=NOT_STARTED
            )
        )
    return ExperimentRecord(
        spec,
        int(record["order_seed"]),
        bool(record["order_seed_drawn"]),
        trials,
        record.get("source"),
        on_cpus=bool(record.get(ON_CPUS_KEY, False)),
        split=recorded_split(record, spec),
    )


def _trial_result(
    output: Path, spec: ExperimentSpec, positions: dict[tuple[str, int], int], trial: TuneTrial
) -> TrialResult | None:
    """A Tune trial as this experiment's TrialResult; None when it is not one of its planned trials. A trial
    continued by --salvage has its rounds before the continuation first (continuation.py)."""
    planned = trial.config.get(TRIAL_KEY)
    key = (planned.get("arm"), planned.get("seed")) if isinstance(planned, dict) else None
    if key not in positions:
        return None
    arm, seed = key
    history, evaluation, started, plans, runs = _history_and_evaluation(
        continued_rows(output, planned) + read_results(trial.folder)
    )
    controller = spec.controller(arm)
    if trial.status == "ERROR":
        status = ERROR
    elif evaluation is not None and (controller is not ControllerKind.PPO or len(history) >= spec.rounds):
        status = FINISHED
    else:
        status = INCOMPLETE if history or evaluation else NOT_STARTED
    ran_in = [Path(link["folder"]).parts[0] for link in links_of(planned)] + [trial.folder.parent.name]
    return TrialResult(
        arm=arm,
        seed=seed,
        position=positions[key],
        controller=controller,
        status=status,
        error=trial.error,
        history=history,
        evaluation=evaluation,
        started_at=started,
        plans=plans,
        runs=runs,
        ran_in=ran_in,
    )


def metric_by_arm(record: ExperimentRecord) -> dict[str, dict[int, float]]:
    """{arm: {seed: metric}} over finished trials only, arms in the experiment file's order."""
    out: dict[str, dict[int, float]] = {arm: {} for arm in record.spec.arms}
    for t in record.trials:
        value = t.metric(record.spec.metric, record.spec.rollout_rounds)
        if t.status == FINISHED and math.isfinite(value):
            out[t.arm][t.seed] = value
    return out


def as_json(record: ExperimentRecord) -> dict[str, Any]:
    ran = with_split(record.spec.on_cpus() if record.on_cpus else record.spec, record.split)  # each trial's config
    configs = {(t.arm, t.seed): t.train for t in ran.trials()}
    fixed = {arm: record.spec.fixed_plan(arm) for arm in record.spec.arms}
    return {
        "experiment": record.spec.to_dict(),
        "source": record.source,
        ON_CPUS_KEY: record.on_cpus,
        SPLIT_KEY: record.split,
        "order_seed": record.order_seed,
        "order_seed_drawn": record.order_seed_drawn,
        "trials": [
            {
                "arm": t.arm,
                "seed": t.seed,
                "controller": t.controller.value,
                "fixed": fixed[t.arm].to_dict() if fixed[t.arm] is not None else None,
                "start_position": t.position,
                "started_at": t.started_at,
                "status": t.status,
                "error": t.error,
                "config": configs[(t.arm, t.seed)],
                "history": t.history,
                "evaluation": t.evaluation,
                "final_metric": t.metric(record.spec.metric, record.spec.rollout_rounds),
                "in_statistics": t.status == FINISHED,
                "ran_in": t.ran_in,
                **({"search_plans": t.plans} if t.plans else {}),
                **({RUNS: t.runs} if t.runs else {}),
            }
            for t in record.trials
        ],
    }
