"""Read a (finished or partial) A/B run back from disk: each trial's history and its comparison metric."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune

from esper_ray.experiments.spec import ExperimentSpec
from esper_ray.experiments.trainable import SUMMARY_PREFIX, TRIAL_KEY, MorphoTrial

TUNE_DIR = "tune"
EXPERIMENT_FILE = "experiment.json"
HISTORY_COLUMNS = ("final_accuracy", "params_added", "host_params", "episode_return", "episodes", "seconds")


@dataclass
class TrialResult:
    arm: str
    seed: int
    position: int
    """Place in the planned start order."""
    status: str
    error: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    started_at: float = math.nan
    """Wall-clock time of the trial's first result minus its duration (Unix seconds)."""

    def metric(self, name: str, last_rounds: int) -> float:
        """Mean of the last `last_rounds` rounds' final-episode figure (NaN if the trial has none)."""
        rows = [r for r in self.history[-last_rounds:] if math.isfinite(r["final_accuracy"])]
        if not rows:
            return math.nan
        if name == "final_accuracy":
            values = [r["final_accuracy"] for r in rows]
        else:  # accuracy per 1,000 parameters of the grown model
            values = [r["final_accuracy"] / ((r["host_params"] + r["params_added"]) / 1000.0) for r in rows]
        return sum(values) / len(values)


@dataclass(frozen=True)
class ExperimentRecord:
    spec: ExperimentSpec
    order_seed: int
    order_seed_drawn: bool
    trials: list[TrialResult]


def collect_trials(output: Path) -> ExperimentRecord:
    record = json.loads((output / EXPERIMENT_FILE).read_text())
    spec = ExperimentSpec.from_mapping(record["experiment"])
    grid = tune.Tuner.restore(str(output / TUNE_DIR), trainable=MorphoTrial).get_results()
    trials = []
    for result in grid:
        config = result.config[TRIAL_KEY]
        frame = result.metrics_dataframe
        history: list[dict[str, float]] = []
        started = math.nan
        if frame is not None and len(frame):
            frame = frame.sort_values("training_iteration")
            for _, row in frame.iterrows():
                entry = {"round": float(row["training_iteration"])}
                entry.update({c: float(row[SUMMARY_PREFIX + c]) for c in HISTORY_COLUMNS})
                history.append(entry)
            first = frame.iloc[0]
            started = float(first["timestamp"]) - float(first["time_this_iter_s"])
        status = "error" if result.error is not None else ("finished" if len(history) >= spec.rounds else "incomplete")
        trials.append(TrialResult(
            arm=config["arm"], seed=int(config["seed"]), position=int(config["position"]), status=status,
            error=None if result.error is None else str(result.error).splitlines()[0], history=history,
            started_at=started,
        ))
    trials.sort(key=lambda t: t.position)
    return ExperimentRecord(spec, int(record["order_seed"]), bool(record["order_seed_drawn"]), trials)


def metric_by_arm(record: ExperimentRecord) -> dict[str, dict[int, float]]:
    """{arm: {seed: metric}} over trials with a finite metric (failed and empty trials are left out)."""
    out: dict[str, dict[int, float]] = {arm: {} for arm in record.spec.arms}
    for t in record.trials:
        value = t.metric(record.spec.metric, record.spec.last_rounds)
        if math.isfinite(value):
            out[t.arm][t.seed] = value
    return out


def as_json(record: ExperimentRecord) -> dict[str, Any]:
    return {
        "experiment": record.spec.to_dict(),
        "order_seed": record.order_seed,
        "order_seed_drawn": record.order_seed_drawn,
        "trials": [
            {
                "arm": t.arm, "seed": t.seed, "start_position": t.position, "started_at": t.started_at,
                "status": t.status, "error": t.error,
                "config": next(tr.train for tr in record.spec.trials() if tr.arm == t.arm and tr.seed == t.seed),
                "history": t.history, "final_metric": t.metric(record.spec.metric, record.spec.last_rounds),
            }
            for t in record.trials
        ],
    }
