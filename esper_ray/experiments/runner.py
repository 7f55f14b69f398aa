"""`esper-ray ab`: every (arm, seed) trial in one Ray Tune run, started in a recorded random order.

Output folder (default esper_runs/<name>):
    experiment.json                 the experiment file's settings, the order seed and the start order
    tune/                           Ray Tune's experiment (one folder per trial, TensorBoard logs included)
    results.json, report.md, metric_by_arm.png, learning_curves.png   (see report.py)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ray
from ray import tune

from esper_ray.experiments.report import write_report
from esper_ray.experiments.results import TUNE_DIR, EXPERIMENT_FILE, collect_trials
from esper_ray.experiments.spec import ExperimentSpec, TrialSpec, draw_order_seed, start_order
from esper_ray.experiments.trainable import TRIAL_KEY, MorphoTrial


def _trial_name(trial: Any) -> str:
    spec = trial.config[TRIAL_KEY]
    return f"{spec['arm']}_seed{spec['seed']}_{trial.trial_id}"


def connect(address: str | None) -> None:
    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address)
    else:
        ray.init(num_cpus=os.cpu_count() or 1)


def plan(spec: ExperimentSpec, output: Path) -> list[TrialSpec]:
    """Fix and record the start order (before anything runs, so an interrupted run keeps it)."""
    order_seed = spec.order_seed if spec.order_seed is not None else draw_order_seed()
    ordered = start_order(spec.trials(), order_seed)
    record = {
        "experiment": spec.to_dict(),
        "order_seed": order_seed,
        "order_seed_drawn": spec.order_seed is None,
        "start_order": [{"position": i, "arm": t.arm, "seed": t.seed} for i, t in enumerate(ordered)],
    }
    (output / EXPERIMENT_FILE).write_text(json.dumps(record, indent=2))
    return ordered


def run_experiment(spec: ExperimentSpec, output: Path, resume: bool = False, address: str | None = None) -> Path:
    output = output.expanduser().resolve()
    tune_path = output / TUNE_DIR
    connect(address)
    if resume:
        if not tune.Tuner.can_restore(str(tune_path)):
            raise FileNotFoundError(f"--resume: no Tune experiment to resume at {tune_path}")
        tuner = tune.Tuner.restore(str(tune_path), trainable=MorphoTrial, resume_unfinished=True, resume_errored=True)
    else:
        if tune_path.exists():
            raise FileExistsError(f"{tune_path} already holds a run: add --resume to continue it, or choose another --output")
        output.mkdir(parents=True, exist_ok=True)
        ordered = plan(spec, output)
        trials = [{"arm": t.arm, "seed": t.seed, "position": i, "train": t.train} for i, t in enumerate(ordered)]
        tuner = tune.Tuner(
            MorphoTrial,
            param_space={TRIAL_KEY: tune.grid_search(trials)},  # grid order = start order
            tune_config=tune.TuneConfig(
                num_samples=1, max_concurrent_trials=spec.max_concurrent_trials,
                trial_name_creator=_trial_name, trial_dirname_creator=_trial_name,
            ),
            run_config=tune.RunConfig(
                name=TUNE_DIR, storage_path=str(output), stop={"training_iteration": spec.rounds},
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=1, checkpoint_at_end=True),
                failure_config=tune.FailureConfig(max_failures=1),
            ),
        )
    tuner.fit()
    write_report(output, collect_trials(output))
    return output
