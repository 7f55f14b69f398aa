"""`esper-ray ab`: every (arm, seed) trial in one Ray Tune run, started in a recorded random order.

Output folder (default esper_runs/<name>):
    experiment.json                 the experiment's settings, the file it came from, the order seed and start order
    tune/                           Ray Tune's experiment (one folder per trial, TensorBoard logs included)
    networks/ARM/seedS/episodeI/    with --save: every evaluation episode's grown network (esper_ray.load_grown)
    results.json, report.md, *.png  the report (see report.py), rewritten after every run or resume
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

from esper_ray.experiments.report import write_report
from esper_ray.experiments.results import EXPERIMENT_FILE, TRIAL_DIR_RE, TUNE_DIR, collect_trials, read_experiment_file
from esper_ray.experiments.spec import ExperimentSpec, TrialSpec, draw_order_seed, start_order
from esper_ray.experiments.trainable import EVAL_PREFIX, NETWORKS_DIR, SUMMARY_PREFIX, TRIAL_KEY, MorphoTrial
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.mps import mps_daemons, mps_environment, new_run_id
from esper_ray.train.preflight import check_env_config
from esper_ray.train.resources import connect_ray
from esper_ray.train.step_failures import FAILURES_LOG


def _trial_label(trial: Any) -> str:
    spec = trial.config[TRIAL_KEY]
    return f"{spec['arm']}/seed{spec['seed']}"


def _trial_name(trial: Any) -> str:
    spec = trial.config[TRIAL_KEY]
    return f"{spec['arm']}_seed{spec['seed']}_{trial.trial_id}"


class TrialEvents(tune.Callback):
    """One console line per trial event (start, round, evaluation, finish, error, retry) instead of Tune's tables."""

    def __init__(self, total: int, rounds: int, print_fn: Any = print) -> None:
        self.total, self.rounds, self.print = total, rounds, print_fn
        self.done = 0
        self.start = time.time()

    def _line(self, text: str) -> None:
        elapsed = time.time() - self.start
        self.print(f"[{int(elapsed // 60):3d}m{int(elapsed % 60):02d}s] {text}", flush=True)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        running = len({t.trial_id for t in trials if t.status == "RUNNING"} | {trial.trial_id})
        self._line(f"started  {_trial_label(trial)} ({running} running, {self.done}/{self.total} done)")

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        parts = []
        if SUMMARY_PREFIX + "round" in result:
            parts.append(f"round {int(result[SUMMARY_PREFIX + 'round'])}/{self.rounds}: rollout acc "
                         f"{100 * result[SUMMARY_PREFIX + 'final_accuracy']:.1f}%")
            if result[SUMMARY_PREFIX + "failed_env_steps"]:
                parts.append(f"FAILED env steps {int(result[SUMMARY_PREFIX + 'failed_env_steps'])} (episodes lost; tracebacks "
                             f"in the trial's {FAILURES_LOG}): {result[SUMMARY_PREFIX + 'env_step_errors']}")
        if EVAL_PREFIX + "test_accuracy" in result:
            parts.append(f"evaluation: test acc {100 * result[EVAL_PREFIX + 'test_accuracy']:.1f}% over "
                         f"{int(result[EVAL_PREFIX + 'episodes'])} episodes, +{result[EVAL_PREFIX + 'params_added']:,.0f} params")
        if parts:
            self._line(f"         {_trial_label(trial)} " + "; ".join(parts))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.done += 1
        self._line(f"finished {_trial_label(trial)} ({self.done}/{self.total} done)")

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(f"retrying {_trial_label(trial)} from its last checkpoint after an error")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.done += 1
        self._line(f"FAILED   {_trial_label(trial)}: retries used up; it is excluded from the statistics ({self.done}/{self.total} done)")


def check_trials_fit(spec: ExperimentSpec, local: bool) -> None:
    """Every arm's env settings work (built once here), and each trial fits the machine: a trial larger than the
    whole cluster would wait in Tune's queue for ever."""
    have = ray.cluster_resources()
    for arm in spec.arms:
        trial = next(t for t in spec.trials() if t.arm == arm)
        check_env_config(TrainConfig.from_mapping(trial.train), log=lambda _: None)
        config = {TRIAL_KEY: {"train": trial.train, "controller": trial.controller.value}}
        need = MorphoTrial.default_resource_request(config).required_resources
        short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
        if short:
            what = ", ".join(f"{v:g} {k} (there are {h:g})" for k, (v, h) in short.items())
            message = f"arms.{arm}: one trial asks for {what}; lower its cpus_per_env / driver_cpus / gpus_per_env or envs"
            if local:
                raise ValueError(message)
            print(f"warning: {message}; it waits for the autoscaler", flush=True)


def plan(spec: ExperimentSpec, output: Path, source: str | None, save_networks: bool = False) -> list[TrialSpec]:
    """Fix and record the start order (before anything runs, so an interrupted run keeps it)."""
    order_seed = spec.order_seed if spec.order_seed is not None else draw_order_seed()
    ordered = start_order(spec.trials(), order_seed)
    record = {
        "experiment": spec.to_dict(),
        "source": source,
        "order_seed": order_seed,
        "order_seed_drawn": spec.order_seed is None,
        "start_order": [{"position": i, "arm": t.arm, "seed": t.seed} for i, t in enumerate(ordered)],
        "save_networks": save_networks,
    }
    (output / EXPERIMENT_FILE).write_text(json.dumps(record, indent=2))
    return ordered


def check_same_experiment(spec: ExperimentSpec, output: Path, source: str | None, save_networks: bool = False) -> None:
    """--resume continues the run in `output` only with the experiment it was started with."""
    stored = read_experiment_file(output)
    if save_networks and not stored.get("save_networks", False):
        raise ValueError(f"--resume --save: the run in {output} was started without --save, and its trials keep the "
                         "settings they started with; start a new run with --save and another --output")
    if stored["experiment"] != spec.to_dict():
        differing = sorted(k for k in set(stored["experiment"]) | set(spec.to_dict())
                           if stored["experiment"].get(k) != spec.to_dict().get(k))
        raise ValueError(
            f"--resume: {output} holds a run of experiment {stored['experiment']['name']!r} from "
            f"{stored.get('source') or 'an unrecorded file'}, but {source or 'the given experiment'} differs in {differing}; "
            f"resume with the original file, or start a new run with another --output"
        )


def gather_networks(output: Path) -> int:
    """Copy the networks the trials kept (tune/<trial>/networks/episodeI/) to networks/ARM/seedS/episodeI/;
    returns how many the run holds."""
    count = 0
    for kept in sorted((output / TUNE_DIR).glob(f"*/{NETWORKS_DIR}/episode*")):
        match = TRIAL_DIR_RE.match(kept.parent.parent.name)
        if match is None or not kept.is_dir():
            continue
        arm, seed = match.group(1), int(match.group(2))
        shutil.copytree(kept, output / NETWORKS_DIR / arm / f"seed{seed}" / kept.name, dirs_exist_ok=True)
        count += 1
    return count


def run_experiment(spec: ExperimentSpec, output: Path, resume: bool = False, address: str | None = None,
                   source: str | None = None, save_networks: bool = False) -> Path:
    # Tune's own tables and hints (its "new output" engine prints them even at verbose=0): TrialEvents says what
    # matters, a line per trial event.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    output = output.expanduser().resolve()
    tune_path = output / TUNE_DIR
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; give a folder for the run")
    events = TrialEvents(len(spec.trials()), spec.rounds)
    wants_mps = any(TrainConfig.from_mapping(t.train).mps for t in spec.trials())
    mps_env = mps_environment(new_run_id()) if wants_mps else None
    if resume:
        check_same_experiment(spec, output, source, save_networks)
        connect_ray(address, env_vars=mps_env)
        if not tune.Tuner.can_restore(str(tune_path)):
            raise FileNotFoundError(f"--resume: no Tune experiment to resume at {tune_path}")
        tuner = tune.Tuner.restore(str(tune_path), trainable=MorphoTrial, resume_unfinished=True, resume_errored=True)
    else:
        if tune_path.exists() or (output / EXPERIMENT_FILE).exists():
            raise FileExistsError(f"{output} already holds a run: add --resume to continue it, or choose another --output")
        connect_ray(address, env_vars=mps_env)
        check_trials_fit(spec, local=address is None)
        output.mkdir(parents=True, exist_ok=True)
        ordered = plan(spec, output, source, save_networks)
        trials = [{"arm": t.arm, "seed": t.seed, "position": i, "controller": t.controller.value,
                   "fixed": t.fixed.to_dict() if t.fixed is not None else None, "save_networks": save_networks,
                   "eval_episodes": spec.eval_episodes, "train": t.train} for i, t in enumerate(ordered)]
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
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                # A trial writes the tracebacks of its failed env steps into its working folder (trainable.py);
                # this copies them into its folder under tune/ with each checkpoint.
                sync_config=tune.SyncConfig(sync_artifacts=True),
                callbacks=[events], verbose=0,
            ),
        )
    print(f"TensorBoard: tensorboard --logdir {output / TUNE_DIR}", flush=True)
    with mps_daemons(mps_env) if mps_env is not None else contextlib.nullcontext():  # one private daemon per GPU node
        tuner.fit()
    write_report(output, collect_trials(output))
    if read_experiment_file(output).get("save_networks", False):
        kept = gather_networks(output)
        print(f"networks: {kept} grown networks in {output / NETWORKS_DIR}/ARM/seedS/episodeI "
              "(load one with esper_ray.load_grown(folder); its summary.md says what it is)", flush=True)
    return output
