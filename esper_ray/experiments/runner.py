"""`esper-ray ab`: every (arm, seed) trial in one Ray Tune run, started in a recorded random order (PPO trials first).

Output folder (default esper_runs/<name>):
    experiment.json                 the experiment's settings, the file it came from, the order seed and start order
    tune/                           Ray Tune's experiment (one folder per trial, TensorBoard logs included)
    tune_files.json                 the manifest of tune/ (size and SHA-256 of each file) as the command left it
    tune_salvaged_N/                a tune/ that no longer matched its manifest, set aside by --resume --salvage
    networks/ARM/seedS/episodeI/    with --save: every evaluation episode's grown network (esper_ray.load_grown);
                                    networks/ARM/seedS/HOST/episodeI/ on a held-out host
    results.json, report.md, *.png  the report (see report.py), rewritten after every run or resume
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
from ray import tune

from esper_ray.contracts.controllers import ControllerKind
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.concurrency import describe, requests_by_kind
from esper_ray.experiments.continuation import CONTINUES_KEY, continuation
from esper_ray.experiments.equal_cost import RUNS
from esper_ray.experiments.lead_trials import LeadTrialsFirst, ShowTrials
from esper_ray.experiments.report import write_report
from esper_ray.experiments.results import (
    ERROR,
    EXPERIMENT_FILE,
    FINISHED,
    ON_CPUS_KEY,
    SALVAGED_PREFIX,
    TRIAL_DIR_RE,
    TUNE_DIR,
    collect_trials,
    read_experiment_file,
    tune_folders,
)
from esper_ray.experiments.spec import (
    HELD_OUT_HOSTS_KEY,
    SHORT_RUN_WARNINGS_KEY,
    ExperimentSpec,
    TrialSpec,
    draw_order_seed,
    start_order,
)
from esper_ray.experiments.trainable import NETWORKS_DIR, MorphoTrial
from esper_ray.experiments.trial_keys import (
    EVAL_PREFIX,
    RUNNER_INIT_SECONDS,
    RUNNERS_UP_SECONDS,
    SETUP_SECONDS,
    SUMMARY_PREFIX,
    TORCH_THREADS,
    TRIAL_KEY,
)
from esper_ray.experiments.trial_split import (
    SPLIT_KEY,
    decide_split,
    ppo_arms,
    recorded_split,
    split_lines,
    with_split,
)
from esper_ray.experiments.tune_folder import read_trials, state_file
from esper_ray.formatting import clock_stamp, counted, time_left
from esper_ray.train.folders.manifest import damage_of, write_atomically, write_manifest
from esper_ray.train.folders.run_lock import LOCK_FILE, run_folder_lock
from esper_ray.train.output.viewer_hints import tensorboard_command
from esper_ray.train.process.mps import mps_daemons, mps_environment, new_run_id
from esper_ray.train.process.preflight import check_env_config
from esper_ray.train.process.resources import connect_ray
from esper_ray.train.process.termination import received as sigterm_received
from esper_ray.train.process.termination import sigterm_acts_as_ctrl_c
from esper_ray.train.rllib.step_failures import FAILURES_LOG

TUNE_MANIFEST = "tune_files.json"
"""Size and SHA-256 of every file under tune/, written whenever the command stops; --resume checks it first."""
TERMINAL = ("TERMINATED", "ERROR")
"""Tune's statuses of a trial that will not run again (finished, or failed with its retries used up)."""


def _trial_label(trial: Any) -> str:
    spec = trial.config[TRIAL_KEY]
    return f"{spec['arm']}/seed{spec['seed']}"


def _trial_name(trial: Any) -> str:
    spec = trial.config[TRIAL_KEY]
    return f"{spec['arm']}_seed{spec['seed']}_{trial.trial_id}"


@dataclass(frozen=True)
class TrialWork:
    """What a trial runs, in episodes: the estimate of the time left counts these."""

    per_round: int
    """Episodes of one PPO round (every env runner's); 0 for a baseline, which does not train."""
    evaluation: int
    """Host runs after training: the evaluation episodes on every host, and a search arm's candidates."""
    rounds_before: int = 0
    """Rounds an earlier command trained: a trial that --salvage continues from its checkpoint of that round."""

    @classmethod
    def of(cls, trial: TrialSpec, eval_episodes: int, rounds_before: int = 0) -> TrialWork:
        cfg = TrainConfig.from_mapping(trial.train)
        hosts = max(1, len(trial.held_out))
        searches = trial.search is not None and trial.host_runs is None  # at equal cost its candidates are the episodes
        per_host = eval_episodes + (trial.search.budget if searches else 0)
        return cls(
            cfg.total_envs * cfg.episodes_per_env if trial.controller is ControllerKind.PPO else 0,
            hosts * per_host,
            rounds_before,
        )

    def total(self, rounds: int) -> int:
        return rounds * self.per_round + self.evaluation


class TrialEvents(tune.Callback):
    """One console line per trial event (start, round, evaluation, finish, error, retry) instead of Tune's tables,
    with an estimate of the time left once some work is done.

    Work is counted in episodes (TrialWork, by (arm, seed)): the estimate assumes the episodes left take as long,
    on average, as those done so far. Its clock runs from each command's first trial start (Tune calls a trial
    started once its setup is done: Ray's start, the plan and the first trials' setups, tens of seconds on a GPU
    machine, would otherwise count as time spent on the first episodes). A trial's rounds and its evaluation count
    as they report.

    A resume keeps the pace: a command counts only the episodes its trials run (not the rounds a restored or
    salvaged trial brings), and adds the seconds and episodes of the run's earlier commands (get_state: Tune saves
    it with the experiment and gives it back on --resume). So the estimate after a resume goes on from the last one
    before it, not from the first rounds after it alone (a restored trial's first round also loads its checkpoint).
    Tune pickles its callbacks with the experiment; `setup`, called at the start of every fit, restarts this
    command's clock. (A run started before `work` existed restores without it: its lines carry no estimate.)
    """

    work: dict[tuple[str, int], TrialWork] = {}
    past_seconds: float = 0.0
    """Seconds of the run's earlier commands, each from its first trial start to its last estimate."""
    past_episodes: int = 0
    """Episodes the run's earlier commands ran in those seconds."""

    def __init__(
        self, total: int, rounds: int, work: dict[tuple[str, int], TrialWork] | None = None, print_fn: Any = print
    ) -> None:
        """`work`: every trial's, by (arm, seed); without it the lines carry no estimate."""
        self.total, self.rounds, self.work, self.print = total, rounds, work or {}, print_fn
        self.setup()

    def setup(self, **info: Any) -> None:
        self.start = time.time()
        self.first_start: float | None = None  # when this command's first trial started: the estimate's clock
        self.ended: set[str] = set()
        self.work_at_start: int | None = None  # episodes done before this command (a resume's), read at its first event
        self.pace = (0.0, 0)  # this command's (seconds, episodes) at its latest estimate

    def get_state(self) -> dict[str, Any]:
        return {"seconds": self.past_seconds + self.pace[0], "episodes": self.past_episodes + self.pace[1]}

    def set_state(self, state: dict[str, Any]) -> None:
        self.past_seconds, self.past_episodes = float(state["seconds"]), int(state["episodes"])

    def _done(self, trials: list[Any]) -> int:
        return len(self.ended | {t.trial_id for t in trials if t.status in TERMINAL})

    def _work_done(self, trial: Any, result: dict[str, Any] | None) -> int:
        """Episodes `trial` has run, from `result` (its newest, if given) or its last result: all once it has
        ended or reported its evaluation, else its rounds' (at least those it continues from)."""
        spec = trial.config[TRIAL_KEY]
        work = self.work[(spec["arm"], spec["seed"])]
        newest = result if result is not None else (trial.last_result or {})
        if trial.trial_id in self.ended or trial.status in TERMINAL or EVAL_PREFIX + "test_accuracy" in newest:
            return work.total(self.rounds)
        return min(max(int(newest.get(SUMMARY_PREFIX + "round", 0)), work.rounds_before), self.rounds) * work.per_round

    def _left(self, trials: list[Any], trial: Any, result: dict[str, Any] | None = None) -> str:
        """`; about 3m05s left`, or nothing before any work is done. Tune creates trials as it goes, so the total
        comes from the experiment, and a trial it has not created yet has done only what it continues from."""
        if not self.work or self.first_start is None:
            return ""
        done = {key: w.rounds_before * w.per_round for key, w in self.work.items()}
        for t in trials:
            spec = t.config[TRIAL_KEY]
            done[(spec["arm"], spec["seed"])] = self._work_done(t, result if t is trial else None)
        if self.work_at_start is None:
            self.work_at_start = sum(done.values())
        self.pace = (time.time() - self.first_start, sum(done.values()) - self.work_at_start)
        seconds, episodes = self.past_seconds + self.pace[0], self.past_episodes + self.pace[1]
        left_episodes = sum(w.total(self.rounds) for w in self.work.values()) - sum(done.values())
        left = time_left(seconds, episodes, episodes + left_episodes)  # at the pace of every command so far
        return f"; {left}" if left else ""

    def _line(self, text: str) -> None:
        self.print(f"{clock_stamp(time.time() - self.start)} {text}", flush=True)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.first_start is None:
            self.first_start = time.time()
        running = len({t.trial_id for t in trials if t.status == "RUNNING"} | {trial.trial_id})
        self._line(
            f"started  {_trial_label(trial)} ({running} running, {self._done(trials)}/{self.total} done"
            f"{self._left(trials, trial)})"
        )

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        parts = []
        if SUMMARY_PREFIX + "round" in result:
            parts.append(
                f"round {int(result[SUMMARY_PREFIX + 'round'])}/{self.rounds}: rollout acc "
                f"{100 * result[SUMMARY_PREFIX + 'final_accuracy']:.1f}%"
            )
            if SETUP_SECONDS in result:
                split = (
                    f" (env runners up after {result[RUNNERS_UP_SECONDS]:.0f} s, then built in "
                    f"{result[RUNNER_INIT_SECONDS]:.0f} s)"
                    if RUNNERS_UP_SECONDS in result
                    else ""
                )
                parts.append(f"its setup {result[SETUP_SECONDS]:.0f} s{split}")
            if result[SUMMARY_PREFIX + "failed_env_steps"]:
                parts.append(
                    f"FAILED env steps {int(result[SUMMARY_PREFIX + 'failed_env_steps'])} (episodes lost; tracebacks "
                    f"in the trial's {FAILURES_LOG}): {result[SUMMARY_PREFIX + 'env_step_errors']}"
                )
        if EVAL_PREFIX + "test_accuracy" in result:
            episodes = counted(int(result[EVAL_PREFIX + "episodes"]), "episode")
            # at equal cost a host's test accuracy is its run best by validation's (equal_cost.py), not the mean
            picked = any(k.startswith(EVAL_PREFIX + RUNS + "/") for k in result)
            parts.append(
                f"evaluation: test acc {100 * result[EVAL_PREFIX + 'test_accuracy']:.1f}% "
                + (f"(best by validation of the host runs, {episodes} in all), " if picked else f"over {episodes}, ")
                + f"+{result[EVAL_PREFIX + 'params_added']:,.0f} params"
                + (f", torch threads {int(result[TORCH_THREADS])}" if TORCH_THREADS in result else "")
            )
        if parts:
            self._line(f"         {_trial_label(trial)} " + "; ".join(parts) + self._left(trials, trial, result))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.ended.add(trial.trial_id)
        self._line(
            f"finished {_trial_label(trial)} ({self._done(trials)}/{self.total} done{self._left(trials, trial)})"
        )

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(f"retrying {_trial_label(trial)} from its last checkpoint after an error")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.ended.add(trial.trial_id)
        self._line(
            f"FAILED   {_trial_label(trial)}: retries used up; it is excluded from the statistics "
            f"({self._done(trials)}/{self.total} done{self._left(trials, trial)})"
        )


def first_trials(spec: ExperimentSpec) -> dict[str, TrialSpec]:
    """One trial of each arm (an arm's trials differ only in their seed)."""
    first: dict[str, TrialSpec] = {}
    for trial in spec.trials():
        first.setdefault(trial.arm, trial)
    return first


def arm_resources(spec: ExperimentSpec) -> dict[str, dict[str, float]]:
    """What one trial of each arm asks Tune for, summed over its bundles (resource -> amount)."""
    return {
        arm: dict(
            MorphoTrial.default_resource_request(
                {TRIAL_KEY: {"train": trial.train, "controller": trial.controller.value}}
            ).required_resources
        )
        for arm, trial in first_trials(spec).items()
    }


def check_trials_fit(spec: ExperimentSpec, needs: dict[str, dict[str, float]], local: bool) -> None:
    """Every arm's env settings work (built once here), and each trial fits the machine: a trial larger than the
    whole cluster would wait in Tune's queue for ever. `needs`: arm_resources(spec)."""
    have = ray.cluster_resources()
    for arm, trial in first_trials(spec).items():
        check_env_config(TrainConfig.from_mapping(trial.train), log=lambda _: None)
        for host, settings in trial.held_out:
            try:
                check_env_config(TrainConfig.from_mapping(settings), log=lambda _: None)
            except ValueError as err:
                raise ValueError(f"held_out host {host!r}: {err}") from None
        if trial.checkpoint is not None:
            check_checkpoint(arm, trial.checkpoint)
        need = needs[arm]
        short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
        if short:
            what = ", ".join(f"{v:g} {k} (there are {h:g})" for k, (v, h) in short.items())
            message = (
                f"arms.{arm}: one trial asks for {what}; lower its cpus_per_env / driver_cpus / gpus_per_env or envs"
            )
            if local:
                raise ValueError(message)
            print(f"warning: {message}; it waits for the autoscaler", flush=True)


def check_checkpoint(arm: str, path: str) -> None:
    """A `checkpoint` arm's checkpoint holds a policy and its observation filter, before any trial starts."""
    from esper_ray.train.commands.evaluate import ENV_TO_MODULE_PATH, MODULE_PATH

    missing = [str(p) for p in (MODULE_PATH, ENV_TO_MODULE_PATH) if not (Path(path) / p).is_dir()]
    if missing:
        raise ValueError(
            f"arms.{arm}.checkpoint={path}: not a checkpoint folder (no {', '.join(missing)} in it); give "
            "one that `esper-ray train` wrote (RUN/checkpoints/round_NNNNN) or an A/B PPO trial's"
        )


def split_on_this_cluster(spec: ExperimentSpec, override: int | str | None) -> dict[str, int]:
    """Each PPO arm's envs_per_runner on this cluster (trial_split.py); a line for each arm whose envs it splits."""
    unsplit = with_split(spec, dict.fromkeys(ppo_arms(spec), 1))
    decided = decide_split(spec, ray.cluster_resources(), arm_resources(unsplit), override)
    for line in split_lines(spec, decided):
        print(f"{spec.name}: {line}", flush=True)
    return {arm: n for arm, (n, _) in decided.items()}


def needs_cpu_fallback(spec: ExperimentSpec, have: dict[str, float], local: bool) -> bool:
    """Whether a new run's trials go on the CPUs: the experiment asks for GPUs and a local cluster (`have`: its
    resources) has none. A cluster joined with --address may still add GPU nodes: there Tune waits for them."""
    return local and have.get("GPU", 0.0) == 0 and spec.asks_for_gpus


def concurrency_line(spec: ExperimentSpec, needs: dict[str, dict[str, float]]) -> str:
    """What the cluster fits at once, per kind of trial (a PPO trial asks for more than a baseline one).
    `needs`: arm_resources(spec)."""
    kinds = {arm: "ppo" if spec.controller(arm) is ControllerKind.PPO else "baseline" for arm in needs}
    return describe(requests_by_kind(kinds, needs), ray.cluster_resources(), spec.max_concurrent_trials)


def plan(
    spec: ExperimentSpec,
    output: Path,
    source: str | None,
    save_networks: bool = False,
    on_cpus: bool = False,
    split: dict[str, int] | None = None,
) -> list[TrialSpec]:
    """Fix and record the start order (before anything runs, so an interrupted run keeps it). `on_cpus`: the
    trials run spec.on_cpus(); `split`: each PPO arm's envs_per_runner (trial_split.py); the record keeps the
    experiment as given, and both."""
    order_seed = spec.order_seed if spec.order_seed is not None else draw_order_seed()
    split = split or {}
    ordered = start_order(with_split(spec.on_cpus() if on_cpus else spec, split).trials(), order_seed)
    record = {
        "experiment": spec.to_dict(),
        SPLIT_KEY: split,
        "source": source,
        "order_seed": order_seed,
        "order_seed_drawn": spec.order_seed is None,
        "start_order": [{"position": i, "arm": t.arm, "seed": t.seed} for i, t in enumerate(ordered)],
        "save_networks": save_networks,
        ON_CPUS_KEY: on_cpus,
        SHORT_RUN_WARNINGS_KEY: spec.short_run_warnings(),
    }
    if isinstance(spec.held_out, str):  # a family's name: its hosts as they were, so `report` needs no plug-in
        record[HELD_OUT_HOSTS_KEY] = [{"name": h.name, "env": dict(h.env)} for h in spec.held_out_hosts]
    write_atomically(output / EXPERIMENT_FILE, json.dumps(record, indent=2))
    return ordered


def check_same_experiment(spec: ExperimentSpec, output: Path, source: str | None, save_networks: bool = False) -> None:
    """--resume continues the run in `output` only with the experiment it was started with."""
    stored = read_experiment_file(output)
    if save_networks and not stored.get("save_networks", False):
        raise ValueError(
            f"--resume --save: the run in {output} was started without --save, and its trials keep the "
            "settings they started with; start a new run with --save and another --output"
        )
    # The cap on trials at once is the machine's, not the experiment's (a flag may set it): it does not decide
    # whether this is the same run. Tune restores a run with the cap it started with.
    machine_keys = {"max_concurrent_trials"}
    started, given = (
        ({k: v for k, v in d.items() if k not in machine_keys}) for d in (stored["experiment"], spec.to_dict())
    )
    if started != given:
        differing = sorted(k for k in set(started) | set(given) if started.get(k) != given.get(k))
        raise ValueError(
            f"--resume: {output} holds a run of experiment {stored['experiment']['name']!r} from "
            f"{stored.get('source') or 'an unrecorded file'}, "
            f"but {source or 'the given experiment'} differs in {differing}; "
            f"resume with the original file, or start a new run with another --output"
        )


def gather_networks(output: Path) -> int:
    """Copy the networks the trials kept (tune/<trial>/networks/episodeI/) to networks/ARM/seedS/episodeI/;
    returns how many the run holds."""
    count = 0
    patterns = (f"*/{NETWORKS_DIR}/episode*", f"*/{NETWORKS_DIR}/*/episode*")  # the trial's own host, held-out hosts
    for kept in sorted(k for folder in tune_folders(output) for pattern in patterns for k in folder.glob(pattern)):
        own_host = kept.parent.name == NETWORKS_DIR
        trial = kept.parent.parent if own_host else kept.parent.parent.parent
        match = TRIAL_DIR_RE.match(trial.name)
        if match is None or not kept.is_dir():
            continue
        arm, seed = match.group(1), int(match.group(2))
        host = [] if own_host else [kept.parent.name]
        shutil.copytree(kept, Path(output, NETWORKS_DIR, arm, f"seed{seed}", *host, kept.name), dirs_exist_ok=True)
        count += 1
    return count


@dataclass(frozen=True)
class ExperimentOutcome:
    output: Path
    interrupted: bool
    """Stopped by Ctrl-C or SIGTERM before every trial finished or failed: `--resume` continues it."""
    terminated: bool
    """Stopped by SIGTERM (a job manager's stop), not by Ctrl-C."""
    failed: list[str]
    """The trials that failed, retries used up (`arm/seedS: the error's last line`)."""
    done: int
    total: int


def check_tune_folder(output: Path, salvage: bool = False) -> bool:
    """Before --resume loads Tune's pickles: whether Tune left an experiment to continue (False: it was stopped
    before its first state file, so nothing ran), and, if it did, that its folder matches the manifest written
    when the command last stopped. Raises ValueError naming the first file that differs; with `salvage`, sets
    the folder aside instead (set_aside) and returns False: what did not finish there runs again."""
    tune_path = output / TUNE_DIR
    if state_file(tune_path) is None:
        return False
    damage = damage_of(tune_path, output / TUNE_MANIFEST)
    if damage is None:
        return True
    if salvage:
        set_aside(output, damage)
        return False
    raise ValueError(
        f"--resume: {tune_path} differs from {TUNE_MANIFEST}, written when `esper-ray ab` last stopped "
        f"({damage}); was it killed (kill -9), or the folder changed since? Tune's pickles there run "
        f"code when loaded, so it is not resumed. Add --salvage to keep its finished trials (read from "
        f"their JSON results, no pickle loaded) and run the others again, a PPO trial from its last "
        f"checkpoint that matches its own manifest; or start a new run with another --output"
    )


def set_aside(output: Path, damage: str) -> Path:
    """--salvage: move tune/ to the next tune_salvaged_N/, never given to Tune again (collect_trials reads its
    finished trials' JSON results), and drop the manifest that no longer describes a tune/."""
    finished = [t for t in collect_trials(output).trials if t.status == FINISHED]
    aside = output / f"{SALVAGED_PREFIX}{len(tune_folders(output))}"
    (output / TUNE_DIR).rename(aside)
    (output / TUNE_MANIFEST).unlink(missing_ok=True)
    print(
        f"--salvage: {output / TUNE_DIR} did not match {TUNE_MANIFEST} ({damage}); set aside as {aside.name}: "
        f"{counted(len(finished), 'finished trial')} kept from their JSON results; "
        "the others run again, a PPO trial from its last "
        f"intact checkpoint",
        flush=True,
    )
    return aside


def run_experiment(
    spec: ExperimentSpec,
    output: Path,
    resume: bool = False,
    address: str | None = None,
    source: str | None = None,
    save_networks: bool = False,
    salvage: bool = False,
    envs_per_runner: int | str | None = None,
) -> ExperimentOutcome:
    """Run (or with `resume` continue) the experiment in `output`, then write its report. `envs_per_runner`: every
    PPO arm's, over the file's (a resume keeps the split the run recorded).

    Ctrl-C or SIGTERM stop it cleanly: Tune saves its state, the manifest of tune/ is written and the report of
    what finished; the outcome says it was interrupted. Interrupted at any point, `--resume` continues it. Killed
    (kill -9, a lost machine), its tune/ no longer matches the manifest: `salvage` keeps its finished trials and
    runs the others again (check_tune_folder).
    """
    # Tune's own tables and hints (its "new output" engine prints them even at verbose=0): TrialEvents says what
    # matters, a line per trial event.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    output = output.expanduser().resolve()
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; give a folder for the run")
    if resume and not output.is_dir():
        read_experiment_file(output)  # raises, naming the folder: there is no run to continue (the lock creates it)
    with run_folder_lock(output):  # one writer, from before Ray starts to the report (train/folders/run_lock.py)
        return _run_in_locked_folder(spec, output, resume, address, source, save_networks, salvage, envs_per_runner)


def _run_in_locked_folder(
    spec: ExperimentSpec,
    output: Path,
    resume: bool,
    address: str | None,
    source: str | None,
    save_networks: bool,
    salvage: bool,
    envs_per_runner: int | str | None = None,
) -> ExperimentOutcome:
    tune_path = output / TUNE_DIR
    wants_mps = any(TrainConfig.from_mapping(t.train).mps for t in spec.trials())
    mps_env = mps_environment(new_run_id()) if wants_mps else None
    continuing = False
    if resume and not any(
        p.name != LOCK_FILE for p in output.iterdir()
    ):  # left empty by a stop before the plan was written
        print(
            f"--resume: nothing was recorded in {output} yet (stopped while Ray started); starting the run", flush=True
        )
        resume = False
    on_cpus = False
    if resume:
        check_same_experiment(spec, output, source, save_networks)
        continuing = check_tune_folder(output, salvage)
        recorded = read_experiment_file(output)
        save_networks = bool(recorded.get("save_networks", False))
        # A resume keeps the device the run started on, so every trial of a run ran on the same kind.
        on_cpus = bool(recorded.get(ON_CPUS_KEY, False))
    elif tune_path.exists() or (output / EXPERIMENT_FILE).exists():
        raise FileExistsError(f"{output} already holds a run: add --resume to continue it, or choose another --output")
    connect_ray(address, env_vars=mps_env)
    if not resume:  # a file that asks for GPUs runs unchanged on a machine without any: on the CPUs, said and recorded
        on_cpus = needs_cpu_fallback(spec, ray.cluster_resources(), local=address is None)
    if on_cpus:
        why = (
            "this run started on a machine without GPUs"
            if resume
            else "the file puts envs on GPUs and this machine has none"
        )
        print(
            f"{spec.name}: {why}; every trial runs on the CPUs (no GPU share, no MPS), slower than on a GPU", flush=True
        )
    run_spec = spec.on_cpus() if on_cpus else spec
    if resume:  # the split the trials started with, on whatever machine resumes them (checkpoints restore into it)
        split = recorded_split(recorded, spec)
        for line in split_lines(spec, {arm: (n, "as the run started") for arm, n in split.items()}):
            print(f"{spec.name}: {line}", flush=True)
    else:
        split = split_on_this_cluster(run_spec, envs_per_runner)
    run_spec = with_split(run_spec, split)
    tuner: tune.Tuner | None = None  # stays None when a salvage left nothing to run
    try:
        with sigterm_acts_as_ctrl_c():  # SIGTERM stops Tune as Ctrl-C does: cleanly, its state saved
            if continuing:
                tuner = tune.Tuner.restore(
                    str(tune_path), trainable=MorphoTrial, resume_unfinished=True, resume_errored=True
                )
                # Tune restores the cap on trials at once that the run started with (experiment.json has it)
                started = replace(run_spec, max_concurrent_trials=recorded["experiment"].get("max_concurrent_trials"))
                print(concurrency_line(started, arm_resources(started)), flush=True)
            else:
                needs = arm_resources(run_spec)
                check_trials_fit(run_spec, needs, local=address is None)
                if resume:  # stopped before Tune recorded a trial, or salvaged: the recorded plan, less what finished
                    shutil.rmtree(tune_path, ignore_errors=True)
                    ordered = unfinished_order(run_spec, output)
                    continues = salvaged_continuations(output, {(t.arm, t.seed) for t in ordered})
                else:
                    output.mkdir(parents=True, exist_ok=True)
                    ordered, continues = plan(spec, output, source, save_networks, on_cpus, split), {}
                work = {
                    (t.arm, t.seed): TrialWork.of(t, spec.eval_episodes, continued_round(continues, (t.arm, t.seed)))
                    for t in ordered
                }
                events = TrialEvents(len(ordered), spec.rounds, work)
                tuner = new_tuner(run_spec, output, ordered, save_networks, events, continues) if ordered else None
                print(concurrency_line(run_spec, needs), flush=True)
            print(f"TensorBoard: {tensorboard_command(output / TUNE_DIR)}", flush=True)
            daemons = mps_env is not None and not on_cpus  # one private daemon per GPU node
            with mps_daemons(mps_env) if daemons else contextlib.nullcontext():
                if tuner is not None:
                    tuner.fit()
    finally:  # also on Ctrl-C before fit: the folder is left as --resume can check it
        if tune_path.is_dir():
            write_manifest(tune_path, output / TUNE_MANIFEST)
    record = collect_trials(output)
    write_report(output, record)
    if save_networks:
        kept = gather_networks(output)
        print(
            f"networks: {counted(kept, 'grown network')} in {output / NETWORKS_DIR}/ARM/seedS/episodeI "
            "(load one with esper_ray.load_grown(folder); its summary.md says what it is)",
            flush=True,
        )
    ended = [t for t in record.trials if t.status in (FINISHED, ERROR)]
    interrupted = len(ended) < len(record.trials)
    failed = [f"{t.arm}/seed{t.seed}: {t.error}" for t in record.trials if t.status == ERROR]
    return ExperimentOutcome(
        output, interrupted, interrupted and sigterm_received(), failed, len(ended), len(record.trials)
    )


def unfinished_order(spec: ExperimentSpec, output: Path) -> list[TrialSpec]:
    """The start order experiment.json recorded, as trials of `spec`, less those that finished (in folders set
    aside by --salvage)."""
    by_key = {(t.arm, t.seed): t for t in spec.trials()}
    finished = {(t.arm, t.seed) for t in collect_trials(output).trials if t.status == FINISHED}
    recorded = [(p["arm"], int(p["seed"])) for p in read_experiment_file(output)["start_order"]]
    return [by_key[key] for key in recorded if key not in finished]


def salvaged_continuations(output: Path, to_run: set[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """For each PPO trial about to run again (`to_run`: its arm and seed) that has an intact checkpoint in the
    newest folder --salvage set aside: where its new trial continues from (continuation.py)."""
    folders = tune_folders(output)[:-1]
    if not folders:
        return {}
    continues = {}
    for trial in read_trials(folders[-1]):
        planned = trial.config.get(TRIAL_KEY)
        if not isinstance(planned, dict) or planned.get("controller") != ControllerKind.PPO.value:
            continue
        key = (planned.get("arm"), planned.get("seed"))
        entry = continuation(output, trial.folder, planned) if key in to_run else None
        if entry is not None:
            continues[key] = entry
    if continues:
        rounds = ", ".join(
            f"{arm}/seed{seed} from round {c['links'][-1]['round']}" for (arm, seed), c in continues.items()
        )
        print(f"--salvage: continued from their last intact checkpoints: {rounds}", flush=True)
    return continues


def continued_round(continues: dict[tuple[str, int], dict[str, Any]], key: tuple[str, int]) -> int:
    """The round a trial that --salvage continues starts from (salvaged_continuations), 0 for one that starts afresh."""
    return int(continues[key]["links"][-1]["round"]) if key in continues else 0


def tune_config(spec: ExperimentSpec, ordered: list[TrialSpec]) -> tune.TuneConfig:
    """Trials in the grid's order (`ordered`), the leading PPO trials all started before Tune creates any other
    (lead_trials.py), at most the spec's max_concurrent_trials at once."""
    leads = next((i for i, t in enumerate(ordered) if t.controller is not ControllerKind.PPO), len(ordered))
    return tune.TuneConfig(
        num_samples=1,  # the cap goes to the generator: Tune ignores max_concurrent_trials beside one
        search_alg=LeadTrialsFirst(leads=leads, max_concurrent=spec.max_concurrent_trials or 0),
        trial_name_creator=_trial_name,
        trial_dirname_creator=_trial_name,
    )


def new_tuner(
    spec: ExperimentSpec,
    output: Path,
    ordered: list[TrialSpec],
    save_networks: bool,
    events: TrialEvents,
    continues: dict[tuple[str, int], dict[str, Any]],
) -> tune.Tuner:
    trials = [
        {
            "arm": t.arm,
            "seed": t.seed,
            "position": i,
            "controller": t.controller.value,
            "fixed": t.fixed.to_dict() if t.fixed is not None else None,
            "save_networks": save_networks,
            "eval_episodes": spec.eval_episodes,
            "train": t.train,
            "metric": spec.metric,
            "held_out": [{"name": name, "train": settings} for name, settings in t.held_out],
            "search": t.search.to_dict() if t.search is not None else None,
            "checkpoint": t.checkpoint,
            "host_runs": t.host_runs,
        }
        for i, t in enumerate(ordered)
    ]
    for trial in trials:
        if (trial["arm"], trial["seed"]) in continues:
            trial[CONTINUES_KEY] = continues[(trial["arm"], trial["seed"])]
    config = tune_config(spec, ordered)
    return tune.Tuner(
        MorphoTrial,
        param_space={TRIAL_KEY: tune.grid_search(trials)},  # grid order = start order
        tune_config=config,
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=str(output),
            stop={"training_iteration": spec.rounds},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=1, checkpoint_at_end=True),
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            # A trial writes the tracebacks of its failed env steps into its working folder (trainable.py);
            # this copies them into its folder under tune/ with each checkpoint.
            sync_config=tune.SyncConfig(sync_artifacts=True),
            callbacks=[events, ShowTrials(config.search_alg)],
            verbose=0,
        ),
    )
