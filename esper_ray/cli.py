"""The `esper-ray` command line. Each subcommand is a thin wrapper over a function of the package."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esper_ray.cli_args import LinesHelpFormatter, add_dataclass_arguments, given, int_or_text, keys_help
from esper_ray.contracts.actions import topology_blueprints
from esper_ray.contracts.controllers import ControllerKind
from esper_ray.contracts.env_config import DEFAULT_TASK, TASKS, EnvConfig
from esper_ray.contracts.envs_split import AUTO, auto_why, split_line
from esper_ray.contracts.fields import check_int, parse_env_overrides, shared_name
from esper_ray.contracts.train_config import (
    MAX_COUNT,
    RUN_ENV_KEYS,
    RUNNERS_KEY,
    TRAIN_OWNED_ENV_KEYS,
    TRAINING_ENV_DEFAULTS,
    TrainConfig,
)
from esper_ray.contracts.yaml_file import load_mapping
from esper_ray.deferred_interrupt import ctrl_c_deferred
from esper_ray.train.process.termination import EXIT_CODE as TERMINATED_EXIT_CODE
from esper_ray.train.process.termination import received as sigterm_received
from esper_ray.train.process.threads import COMMAND_THREADS, threads_line, threads_of_cpus

if TYPE_CHECKING:  # experiments/spec.py is imported when `ab` runs, not for every command
    from esper_ray.experiments.spec import ExperimentSpec


def _cmd_host(args: argparse.Namespace) -> int:
    from esper_ray.morpho.blueprints import count_params
    from esper_ray.morpho.hosts import build_host

    preset = EnvConfig(
        task=args.task, host_preset=args.host_preset, plugins=tuple(args.plugins)
    ).effective_host_preset  # the env's own rule
    host = build_host(preset)
    blueprints = topology_blueprints(host.topology.value)
    print(f"host {preset} ({host.topology.value}): {count_params(host):,} parameters, slots {', '.join(host.slot_ids)}")
    print(f"{'slot':<6}{'features':>14}" + "".join(f"{b.key:>15}" for b in blueprints))
    for slot in host.slot_ids:
        shape = " x ".join(str(d) for d in host.slot_shape(slot))
        channels = host.slot_channels(slot)
        print(f"{slot:<6}{shape:>14}" + "".join(f"{_seed_size(b, channels, host.topology):>15}" for b in blueprints))
    return 0


def _seed_size(blueprint: Any, channels: int, topology: Any) -> str:
    from esper_ray.morpho.blueprints import build_seed, count_params

    try:
        return f"{count_params(build_seed(blueprint, channels, topology)):,}"
    except ValueError:  # flex_attention where it cannot run (no CPU backward)
        return "n/a here"


VERBOSE_ENV = "ESPER_RAY_VERBOSE"  # read by train/process/resources.py when it starts or joins Ray
VERBOSE_HELP = "show Ray's own log lines and the workers' output"
ENV_FLAGS_HELP = "environment (one env per episode; same names as env_config keys)"
EVAL_EPISODES = 3
JSON_HELP = "print the summaries as one JSON document on stdout (the progress lines go to stderr, as always)"
THREADS_HELP = (
    f"torch threads of this process (default: {COMMAND_THREADS}; the tiny CNN hosts gain nothing from more, and "
    "processes side by side fight over the cores)"
)
SAVE_HELP = (
    "keep the host run's grown network in this new folder: weights.pt, architecture.json, summary.md and "
    "accuracy.png; load it with esper_ray.load_grown(DIR). One episode only"
)


AB_ENVS_PER_RUNNER_HELP = (
    "envs each env runner of a PPO trial steps, for every arm, over the file's envs_per_runner (default: the file's, "
    "else auto: one env a runner unless a trial's share of the CPUs (the cluster's CPUs over the trials that fit at "
    "once) is fewer than its envs, then as few envs a runner as fill that share; one a runner on GPUs). N divides "
    "every PPO arm's envs. It changes no episode, only the processes; a run keeps the split it started with when "
    "resumed"
)
EVAL_SEED_HELP = "env seed (default: the training seed)"
EVAL_ENV_HELP = "override an env setting, e.g. --env device=cpu"
GROW_SEED_HELP = "env seed: the host's initialisation and data order (default: the checkpoint's training seed)"
GROW_ENV_HELP = (
    "an env setting on top of the checkpoint's (repeatable), e.g. --env max_epochs=40 "
    "--env 'slots=[h0, h1, h2]' --env device=cpu"
)


def _cmd_heuristic(args: argparse.Namespace) -> int:
    with ctrl_c_deferred():  # native libraries load here (deferred_interrupt.py)
        from esper_ray.train.commands.grow import check_save_folder, saver
        from esper_ray.train.commands.heuristic import CONTROLLER_NAME, run_heuristic

    check_int("--episodes", args.episodes, 1, MAX_COUNT)
    folder = check_save_folder(args.save, args.episodes) if args.save else None
    # measure_test: the held-out test accuracy, as `eval` prints it, so the two compare
    # the env settings of every command's runs (TRAINING_ENV_DEFAULTS) under the flags: the A/B heuristic arm's
    # lifecycle
    summaries = run_heuristic(
        {**TRAINING_ENV_DEFAULTS, **given(args, args.env_fields)},
        args.episodes,
        measure_test=True,
        on_episode_end=saver(folder, CONTROLLER_NAME) if folder else None,
        threads=args.threads,
    )
    _print_summaries(summaries, args.json)
    _print_saved(folder, args.json)
    return 0


def _print_saved(folder: Path | None, as_json: bool) -> None:
    from esper_ray.train.commands.grow import saved_line

    if folder is not None:  # on stderr under --json, so stdout stays one JSON document
        print(saved_line(folder), file=sys.stderr if as_json else sys.stdout)


def _print_summaries(summaries: Sequence[Any], as_json: bool) -> None:
    from esper_ray.train.commands.episodes import format_summary

    if as_json:
        print(json.dumps([s.as_dict() for s in summaries], indent=2))
    else:
        for s in summaries:
            print(format_summary(s))


def _plain(value: Any) -> Any:
    """Lists for tuples, so a setting compares equal however it was written."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def train_config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, Path | None]:
    """defaults < --config file < flags; with --resume, the checkpoint's settings (only rounds/output/address change).

    The run folder: a fresh one. With --resume, the resumed run's own folder (continued in place) unless --output
    names another, fresh one. Without it, the default folder gets a number when it holds a run already, and an
    explicit --output that holds a run is refused.
    """
    from esper_ray.train.folders.checkpoints import fresh_run_folder

    flags = given(args, args.train_fields)
    env = parse_env_overrides(args.env)
    if args.resume is not None:
        return _resumed_train_config(args, flags, env)
    mapping = load_mapping(args.config, "config file") if args.config else {}
    if not isinstance(mapping.get("env", {}), dict):
        raise ValueError(f"{args.config}: env must be a mapping of env settings")
    merged_env = {**dict(mapping.pop("env", {}) or {}), **env}
    cfg = TrainConfig.from_mapping({**mapping, **flags, "env": merged_env})
    if "slots" not in flags and "slots" not in mapping and cfg.family is None:  # a family's members name their own
        from esper_ray.morpho.hosts import default_slots

        cfg = dataclasses.replace(cfg, slots=default_slots(cfg.host_name, cfg.slots))
    explicit = "output" in flags or "output" in mapping
    output = fresh_run_folder(Path(cfg.output).expanduser().resolve(), numbered=not explicit)
    return dataclasses.replace(cfg, output=str(output)), None


def _without_auto_split(settings: dict[str, Any]) -> dict[str, Any]:
    """A resumed run's split is the one it recorded (train_config.json), whatever cores this machine has: `auto` asks
    for nothing else (an integer must equal it, as any other setting must)."""
    return {k: v for k, v in settings.items() if not (k == "envs_per_runner" and v == AUTO)}


def _resumed_train_config(
    args: argparse.Namespace, flags: dict[str, Any], env: dict[str, Any]
) -> tuple[TrainConfig, Path]:
    """train_config_from_args with --resume: the checkpoint's settings, of which only rounds, output and address
    change; the run continues in its own folder unless --output names another, fresh one."""
    from esper_ray.train.folders.checkpoints import (
        fresh_run_folder,
        left_without_checkpoint,
        load_checkpoint_config,
        records_a_round,
        resolve_checkpoint,
        round_of,
        run_folder_of,
    )

    flags = _without_auto_split(flags)
    folder = Path(args.resume).expanduser()
    if left_without_checkpoint(folder):  # a run killed before its first checkpoint
        again = (
            "start it again with another --output (without --resume): its metrics.jsonl keeps the rounds it finished"
            if records_a_round(folder)
            else f"start it again with --output {shlex.quote(args.resume)} (without --resume): a new run takes that "
            "folder"
        )
        raise ValueError(
            f"--resume {args.resume}: the run there saved no checkpoint (it stopped before its first), "
            f"so there is nothing to continue; {again}"
        )
    checkpoint = resolve_checkpoint(args.resume)
    stored = load_checkpoint_config(checkpoint)
    given_settings = _without_auto_split({**(load_mapping(args.config, "config file") if args.config else {}), **flags})
    if env:
        given_settings["env"] = {**dict(given_settings.get("env", {}) or {}), **env}
    # the stored settings with the split spelled out (its record leaves out one env a runner, and marks the others)
    base = {k: v for k, v in stored.to_dict().items() if k != RUNNERS_KEY} | {"envs_per_runner": stored.envs_per_runner}
    asked = TrainConfig.from_mapping({**base, **given_settings})  # compared as built: `env` whole
    changed = sorted(
        k
        for k in given_settings
        if k not in ("rounds", "output", "address") and _plain(getattr(asked, k)) != _plain(getattr(stored, k))
    )
    if changed:
        raise ValueError(
            f"--resume continues a run with its own settings; only --rounds, --output and --address may "
            f"change, and {changed} differ from the run's (see {checkpoint / 'train_config.json'})"
        )
    done = round_of(checkpoint)
    rounds = flags.get("rounds", stored.rounds)
    if rounds <= done:
        raise ValueError(
            f"--rounds {rounds}: --rounds is the total number of rounds, and {checkpoint} has done {done} "
            f"already; give --rounds {done + stored.rounds} to train {stored.rounds} more"
        )
    run_dir = run_folder_of(checkpoint).resolve()
    output = Path(flags["output"]).expanduser().resolve() if "output" in flags else run_dir
    if output != run_dir:
        output = fresh_run_folder(output, numbered=False)
    return TrainConfig.from_mapping({**base, **flags, "rounds": rounds, "output": str(output)}), checkpoint


def _cmd_train(args: argparse.Namespace) -> int:
    from esper_ray.formatting import counted
    from esper_ray.train.folders.run_lock import check_can_write
    from esper_ray.train.output.progress_lines import warn
    from esper_ray.train.process.preflight import check_env_config

    # Every argument is checked before Ray is imported: importing it takes 30-165 s on a busy machine
    cfg, resume = train_config_from_args(args)
    check_can_write(Path(cfg.output), "--output")
    check_env_config(cfg)  # a bad env setting fails here, once, not in every env runner
    with ctrl_c_deferred():  # Ray loads here (deferred_interrupt.py)
        from esper_ray.train.commands.runner import format_outcome, run_training

    what = f"family {cfg.family}" if cfg.family is not None else f"task {cfg.task}"
    cfg, split = _split_envs(cfg, resumed=resume is not None)
    print(
        f"esper-ray train: {what}, {counted(cfg.envs, 'env')} x {counted(cfg.episodes_per_env, 'episode')} of "
        f"{counted(cfg.max_epochs, 'epoch')} per round, {counted(cfg.rounds, 'round')}, reward {cfg.reward_mode}, "
        f"output {cfg.output}; {split + ', ' if split else ''}"
        f"{threads_line(threads_of_cpus(cfg.cpus_per_env))} per env runner (its CPUs)",
        flush=True,
    )
    warn("train", cfg.short_run_warning())
    outcome = run_training(cfg, Path(cfg.output), resume=resume, env_checked=True)
    print(format_outcome(outcome))
    if outcome.terminated:
        return TERMINATED_EXIT_CODE
    return 130 if outcome.interrupted else 0


def _split_envs(cfg: TrainConfig, resumed: bool) -> tuple[TrainConfig, str | None]:
    """The run's envs split into env runners (TrainConfig.envs_per_runner), and how the head line says it where
    a runner steps more than one env. `auto` is decided here for a local Ray, which gets os.cpu_count() CPUs
    (train/process/resources.py); on a cluster (--address) once joined, by run_training."""
    if cfg.envs_per_runner == AUTO:
        if cfg.address is not None:
            return cfg, "envs split into env runners by the cluster's CPUs once joined (auto)"
        cores = os.cpu_count() or 1
        cfg = cfg.resolved(cores)
        why = auto_why(cores, cfg.gpus_per_env > 0)
    else:
        why = "as the run started" if resumed else None
    per_runner = cfg.runner_envs
    return cfg, split_line(cfg.envs, per_runner, why) if per_runner > 1 else None


def _cmd_eval(args: argparse.Namespace) -> int:
    from esper_ray.train.commands.grow import check_save_folder, saver
    from esper_ray.train.folders.checkpoints import resolve_checkpoint, round_of

    episodes = args.episodes if args.episodes is not None else (1 if args.save else EVAL_EPISODES)
    check_int("--episodes", episodes, 1, MAX_COUNT)
    folder = check_save_folder(args.save, episodes) if args.save else None
    checkpoint = resolve_checkpoint(args.checkpoint)  # before RLlib is imported: seconds, not a minute
    env_overrides = parse_env_overrides(args.env)
    with ctrl_c_deferred():  # RLlib loads here (deferred_interrupt.py)
        from esper_ray.train.commands.evaluate import mean_line, run_evaluation
        from esper_ray.train.process.resources import quiet_ray_logs

    quiet_ray_logs()  # eval starts no Ray, but loads RLlib's modules, which log their own deprecation notices
    # A training folder stands for its newest checkpoint: say which one is evaluated (stderr under --json)
    print(
        f"esper-ray eval: checkpoint {checkpoint} (round {round_of(checkpoint)})",
        file=sys.stderr if args.json else sys.stdout,
        flush=True,
    )
    summaries = run_evaluation(
        checkpoint,
        episodes,
        seed=args.seed,
        env_overrides=env_overrides,
        on_episode_end=saver(
            folder, f"the greedy PPO policy of checkpoint {shared_name(checkpoint)}", shared_name(checkpoint)
        )
        if folder
        else None,
        threads=args.threads,
    )
    _print_summaries(summaries, args.json)
    print(mean_line(summaries), file=sys.stderr if args.json else sys.stdout)  # stdout stays one JSON document
    _print_saved(folder, args.json)
    return 0


def _check_grow_args(args: argparse.Namespace) -> None:
    """What `grow` could be refused for that needs no RLlib: the checkpoint, the plug-ins, the host and its task, the
    --env settings and the --save folder, checked before RLlib (and Ray) are imported: seconds, not a minute."""
    from esper_ray.contracts import registry
    from esper_ray.train.folders.checkpoints import load_checkpoint_config, resolve_checkpoint

    cfg = load_checkpoint_config(resolve_checkpoint(args.checkpoint))
    registry.load_plugins([*cfg.plugins, *args.plugins])
    registry.host(args.host, field="--host")  # an unknown name lists the registered ones
    if args.task is None and not any(args.host in registry.task(t).hosts for t in registry.task_names()):
        raise ValueError(
            f"--host {args.host}: no registered task lists it as its own host, so the data it grows on "
            f"must be named: add --task NAME, NAME one of {registry.task_names()} (or a package.module:loader)"
        )
    parse_env_overrides(args.env)
    save = Path(args.save).expanduser() if args.save else None
    if save is not None and save.exists() and (not save.is_dir() or any(save.iterdir())):
        raise FileExistsError(f"--save {save.resolve()}: already exists and is not an empty folder; choose a new one")


def _cmd_grow(args: argparse.Namespace) -> int:
    _check_grow_args(args)
    with ctrl_c_deferred():  # RLlib loads here (deferred_interrupt.py)
        from esper_ray.train.commands.grow_command import GrowRequest, run_grow
        from esper_ray.train.process.resources import quiet_ray_logs

    quiet_ray_logs()  # no Ray is started, but RLlib's modules log their own deprecation notices
    run_grow(
        GrowRequest(
            args.checkpoint,
            args.host,
            args.task,
            tuple(args.plugins),
            tuple(args.env or ()),
            args.seed,
            args.save,
            args.sample,
            args.threads,
        )
    )
    return 0


def _cmd_ab(args: argparse.Namespace) -> int:
    from esper_ray.experiments.spec import ExperimentSpec
    from esper_ray.formatting import counted
    from esper_ray.train.output.progress_lines import warn

    spec = ExperimentSpec.from_yaml(args.experiment)  # checked before Ray and Tune are imported: seconds, not 15-30
    try:
        spec.check_checkpoints()  # every seed's checkpoint folder, before Ray starts (a minute on a busy machine)
    except ValueError as err:
        raise ValueError(f"{Path(args.experiment).expanduser()}: {err}") from None
    if args.max_concurrent_trials is not None:  # the machine's share, not the experiment's: a flag overrides the file
        check_int("--max-concurrent-trials", args.max_concurrent_trials, 1)
        spec = dataclasses.replace(spec, max_concurrent_trials=args.max_concurrent_trials)
    _check_ab_envs_per_runner(args, spec)
    output = Path(args.output) if args.output else Path("esper_runs") / spec.name
    _print_ab_plan(spec, output)
    for line in spec.short_run_warnings():
        warn("ab", line)
    if args.salvage and not args.resume:
        raise ValueError("--salvage: it keeps what a killed run finished when resuming it; add --resume")
    with ctrl_c_deferred():  # Ray and Tune load here (deferred_interrupt.py)
        from esper_ray.experiments.runner import run_experiment

    resume_hint = f"resume with: {ab_resume_command(args.experiment, output)}"
    try:
        outcome = run_experiment(
            spec,
            output,
            resume=args.resume,
            address=args.address,
            source=experiment_source(Path(args.experiment)),
            save_networks=args.save,
            salvage=args.salvage,
            envs_per_runner=args.envs_per_runner,
        )
    except KeyboardInterrupt:  # before Tune ran (while Ray starts, say): main() exits with 130 or 143
        if (output / "experiment.json").is_file():
            print(f"esper-ray ab: stopped before any trial ran; {resume_hint}", file=sys.stderr, flush=True)
        raise
    if outcome.interrupted:
        what = "terminated (SIGTERM)" if outcome.terminated else "interrupted"
        print(
            f"esper-ray ab: {what} with {outcome.done} of {counted(outcome.total, 'trial')} done; "
            "the report so far is in "
            f"{outcome.output / 'report.md'}; {resume_hint}",
            file=sys.stderr,
            flush=True,
        )
        return TERMINATED_EXIT_CODE if outcome.terminated else 130
    _print_report(outcome.output)
    if outcome.failed:
        print(
            f"esper-ray ab: {len(outcome.failed)} of {counted(outcome.total, 'trial')} failed "
            "and are left out of the statistics: " + "; ".join(outcome.failed),
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def _check_ab_envs_per_runner(args: argparse.Namespace, spec: ExperimentSpec) -> None:
    """`ab --envs-per-runner`: how a trial's envs are split into processes, the machine's choice as the cap on trials
    at once is; a resumed run keeps its own."""
    from esper_ray.experiments.trial_split import check_override

    if args.envs_per_runner is None:
        return
    if args.resume:
        raise ValueError(
            f"--envs-per-runner {args.envs_per_runner}: a resumed run keeps the split it started with "
            "(experiment.json), which its checkpoints restore into; leave the flag out"
        )
    check_override(spec, args.envs_per_runner)


def _print_ab_plan(spec: ExperimentSpec, output: Path) -> None:
    """The line `esper-ray ab` prints before Ray starts: the arms, seeds and trials, what each does, where to."""
    from esper_ray.formatting import counted

    trials = len(spec.trials())
    arms = ", ".join(f"{a} ({spec.controller(a).value})" for a in spec.arms)
    cap = spec.max_concurrent_trials
    at_once = f"up to {cap}" if cap is not None else "as many as the cluster's CPUs and GPUs fit"
    episodes = counted(spec.eval_episodes, 'evaluation episode')
    trains = any(spec.controller(a) is ControllerKind.PPO for a in spec.arms)
    work = (
        f"{counted(spec.rounds, 'PPO round')}, then {episodes} each" if trains else f"{episodes} each, no training"
    )  # announce only what the arms do
    print(
        f"esper-ray ab: {spec.name}: arms {arms} x {counted(len(spec.seeds), 'seed')} = {counted(trials, 'trial')} "
        f"({work}), "
        f"{at_once} at once; output {output}",
        flush=True,
    )


def ab_resume_command(experiment: str | Path, output: Path) -> str:
    """The command that resumes an A/B run, quoted for a POSIX shell so that it works as pasted (spaces, quotes)."""
    return shlex.join(["esper-ray", "ab", str(experiment), "--output", str(output), "--resume"])


def experiment_source(path: Path, cwd: Path | None = None) -> str:
    """How results.json names the experiment file: relative to the folder the command ran in (as in
    `esper-ray ab tune_configs/smoke.yaml`), or by its name alone when it lies elsewhere, never an absolute path
    of the machine that ran it (a result shared or committed would carry the user's home folder)."""
    resolved = path.expanduser().resolve()
    try:
        return resolved.relative_to((cwd or Path.cwd()).resolve()).as_posix()
    except ValueError:
        return resolved.name


def _print_report(run_dir: Path) -> None:
    from esper_ray.experiments.equal_cost_report import FIGURE
    from esper_ray.experiments.report import FIGURES
    from esper_ray.train.output.viewer_hints import tensorboard_command

    print((run_dir / "report.md").read_text())
    figures = [*FIGURES, *([FIGURE] if (run_dir / FIGURE).is_file() else [])]  # at equal cost (host_runs)
    print(
        f"report: {run_dir / 'report.md'}; data: {run_dir / 'results.json'}; figures: "
        + ", ".join(str(run_dir / f) for f in figures)
        + f"; TensorBoard: {tensorboard_command(run_dir / 'tune')}"
    )


def _cmd_report(args: argparse.Namespace) -> int:
    from esper_ray.experiments.report import write_report
    from esper_ray.experiments.results import FINISHED, collect_trials

    run_dir = Path(args.run_dir).expanduser().resolve()
    record = collect_trials(run_dir)
    if not any(t.status == FINISHED for t in record.trials):  # a report of n=0 and "n/a" throughout tells nothing
        source = shlex.quote(record.source) if record.source else "FILE"
        raise ValueError(
            f"{run_dir}: no trial has finished yet ({len(record.trials)} planned): nothing to report; "
            f"continue the run with: esper-ray ab {source} --resume --output {shlex.quote(str(run_dir))}"
        )
    write_report(run_dir, record)
    _print_report(run_dir)
    return 0


def _threads_flag() -> argparse.ArgumentParser:
    """--threads of the commands that step envs in this process (heuristic, eval, grow)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--threads", type=int, default=COMMAND_THREADS, help=THREADS_HELP)
    return parent


def _episode_results_flags() -> argparse.ArgumentParser:
    """--json and --save of the commands that print episode summaries (heuristic, eval)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help=JSON_HELP)
    parent.add_argument("--save", metavar="DIR", help=SAVE_HELP)
    return parent


def _checkpoint_run_flags(seed_help: str, env_help: str) -> argparse.ArgumentParser:
    """--seed and --env of the commands that run a checkpoint's policy (eval, grow): the same flags, each command's
    own words for what its run does with them."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--seed", type=int, default=None, help=seed_help)
    parent.add_argument("--env", action="append", metavar="KEY=VALUE", help=env_help)
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="esper-ray",
        allow_abbrev=False,
        description="Grow neural networks while they train, with a PPO controller deciding when and what to grow.",
    )
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    # Every subcommand takes --verbose too (`esper-ray train --verbose`); SUPPRESS keeps a subcommand from
    # resetting what was given before it (`esper-ray --verbose train`).
    verbose_after = argparse.ArgumentParser(add_help=False)
    verbose_after.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_host, _add_heuristic, _add_train, _add_eval, _add_grow, _add_ab, _add_report):
        add(sub, verbose_after)
    return parser


def _add_host(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray host`: a task's host network, its slots and seed sizes."""
    host = sub.add_parser(
        "host",
        allow_abbrev=False,
        parents=[verbose_after],
        help="show a task's host network: its slots and each blueprint's parameter count",
        description="Print a task's host network (the network a run grows from): its parameter "
        "count, its injection slots (where seeds are planted: the names --slots takes) with the shape "
        "of the features at each, and the parameters a seed of each blueprint adds there. Starts no Ray.",
    )
    # The same names and defaults as `train` and `heuristic` (EnvConfig's task and host_preset)
    host.add_argument(
        "--task",
        default=DEFAULT_TASK,
        help=f"the task whose host to show: {', '.join(TASKS)} or a plug-in's (default: {DEFAULT_TASK})",
    )
    host.add_argument(
        "--host-preset",
        default=None,
        help="another host the task may use: text-gpu or text-starved for task text, or a plug-in's "
        "(default: the task's own)",
    )
    host.add_argument(
        "--plugins",
        nargs="+",
        default=[],
        metavar="PLUGINS",
        help="modules that register your own tasks, hosts or blueprints (docs/plugins.md)",
    )
    host.set_defaults(func=_cmd_host)


def _add_heuristic(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray heuristic`: the rule-based controller's episodes."""
    heuristic = sub.add_parser(
        "heuristic",
        allow_abbrev=False,
        parents=[verbose_after, _episode_results_flags(), _threads_flag()],
        help="run the heuristic controller and print each episode's outcome",
        description="Run the rule-based controller (germinate on plateau, fossilize seeds that contribute, prune "
        "those that hurt) for some episodes and print, per episode: final and test accuracy, parameters added "
        "and seeds germinated/fossilized/pruned. With --save DIR, one episode, whose grown network is kept in DIR.",
    )
    heuristic.add_argument("--episodes", type=int, default=1, help="episodes to run (default: 1)")
    env_group = heuristic.add_argument_group(ENV_FLAGS_HELP)
    heuristic.set_defaults(
        func=_cmd_heuristic,
        env_fields=add_dataclass_arguments(
            env_group, EnvConfig, exclude=("shard", "num_shards", "gamma"), defaults=TRAINING_ENV_DEFAULTS
        ),
    )


def _add_train(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray train`: PPO on Ray; TrainConfig's fields are its flags, EnvConfig's its --env keys."""
    train = sub.add_parser(
        "train",
        allow_abbrev=False,
        parents=[verbose_after],
        help="train the controller with PPO on Ray "
        "(defaults: digits-impaired, local CPU, 20 rounds: 3-9 minutes on 2 cores)",
        description="Train the growth controller with RLlib's PPO: --envs environments, each on its own data shard, "
        "one per env-runner actor unless there are more than CPU cores (--envs-per-runner), and a central learner. "
        "Prints a line per round and a summary; writes checkpoints, "
        "metrics.jsonl and TensorBoard logs under --output. Settings: defaults < --config FILE.yaml < flags.",
        formatter_class=LinesHelpFormatter,
        epilog=keys_help(
            "env settings, each given as --env KEY=VALUE (or under env: in --config; "
            f"{', '.join(sorted(TRAIN_OWNED_ENV_KEYS - {'shard', 'num_shards'}))} are train's own settings):",
            EnvConfig,
            exclude=TRAIN_OWNED_ENV_KEYS,
            defaults=TRAINING_ENV_DEFAULTS,
        ),
    )
    train.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="YAML file of training settings (same names as the flags; unknown keys are errors)",
    )
    train.add_argument(
        "--resume",
        metavar="DIR",
        help="continue a run in its own folder (a training output folder, or one "
        "of its checkpoint folders); --rounds is the total, so give more than the run has done",
    )
    train.add_argument(
        "--env",
        action="append",
        metavar="KEY=VALUE",
        help="an env setting (repeatable), e.g. --env batch_size=128 --env device=cuda; the keys are listed below",
    )
    train.set_defaults(
        func=_cmd_train,
        train_fields=add_dataclass_arguments(train, EnvConfig, only=RUN_ENV_KEYS)
        + add_dataclass_arguments(train, TrainConfig, exclude=("env",)),
    )


def _add_eval(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray eval`: a checkpoint's greedy policy on fresh episodes."""
    evaluate = sub.add_parser(
        "eval",
        allow_abbrev=False,
        parents=[
            verbose_after,
            _checkpoint_run_flags(EVAL_SEED_HELP, EVAL_ENV_HELP),
            _episode_results_flags(),
            _threads_flag(),
        ],
        help="run a checkpoint's greedy policy and print each episode's outcome (as `heuristic` does); "
        "--save keeps the grown network",
        description="Run the greedy policy of a checkpoint on fresh episodes of its task and print, per episode: final "
        "and test accuracy, parameters added and seeds germinated/fossilized/pruned, "
        "so it can be compared with `esper-ray heuristic`. "
        "With --save DIR, one episode, whose grown network is kept in DIR "
        "(a PyTorch module: esper_ray.load_grown(DIR)).",
    )
    evaluate.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="a checkpoint folder or a training output folder (its newest checkpoint)",
    )
    evaluate.add_argument(
        "--episodes", type=int, default=None, help=f"episodes to run (default: {EVAL_EPISODES}, or 1 with --save)"
    )
    evaluate.set_defaults(func=_cmd_eval)


def _add_grow(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray grow`: a checkpoint's policy grows one host, and the network is kept."""
    grow = sub.add_parser(
        "grow",
        allow_abbrev=False,
        parents=[verbose_after, _checkpoint_run_flags(GROW_SEED_HELP, GROW_ENV_HELP), _threads_flag()],
        help="a trained controller grows your host (built in or a plug-in's) once, and the network is kept; "
        "no RL training",
        description="Grow a host network with a trained controller: the checkpoint's policy, frozen, makes every "
        "decision of ONE host training run on --host (a registered host, or a package.module:HostClass import string) "
        "and its task, and the grown network is saved as `eval --save` saves one (weights.pt, architecture.json, "
        "summary.md, accuracy.png; esper_ray.load_grown(DIR)). Unlike `eval`, which scores a checkpoint on its own "
        "task over several episodes, grow runs once, on the host you name, for the network it gives you; unlike "
        "`train`, it trains no controller. The run takes the checkpoint's env settings (epochs, lifecycle) with the "
        "host, its task and its slots put in (the checkpoint's slots where the host has them all, else every slot "
        "the host declares), then --env. Refused in one line before the host trains: an unknown host or task, a "
        "policy that cannot decide for this host (a host above MAX_SLOTS = 16 slots, or a checkpoint of another "
        "policy layout), a --save folder that is in use. "
        "Runs in this process, without Ray.",
    )
    grow.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a checkpoint folder or a training output folder (its newest checkpoint)",
    )
    grow.add_argument(
        "--host",
        required=True,
        metavar="NAME_OR_IMPORT_STRING",
        help="the host to grow: a registered name (digits, cifar10, text, ... or a plug-in's) or "
        "package.module:HostClass (built with no arguments)",
    )
    grow.add_argument(
        "--task",
        default=None,
        metavar="NAME",
        help="the data it grows on (default: the checkpoint's task if the host is one of its own, else "
        "the task the host is registered for; a host no task lists needs --task)",
    )
    grow.add_argument(
        "--plugins",
        nargs="+",
        default=[],
        metavar="MOD",
        help="modules that register your own tasks, hosts or blueprints (docs/plugins.md), imported "
        "with those the checkpoint names",
    )
    grow.add_argument(
        "--sample",
        action="store_true",
        help="sample each decision from the policy instead of taking its most likely one (draws fixed by --seed)",
    )
    grow.add_argument(
        "--save",
        metavar="DIR",
        help="a new folder for the network (default: a new one under the run "
        "folder's grown/, or ./grown/ where that cannot be written, named HOST-seedS and numbered past "
        "any that exists; printed)",
    )
    grow.set_defaults(func=_cmd_grow)


def _add_ab(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray ab`: an experiment file's trials on Ray Tune, compared seed by seed."""
    ab = sub.add_parser(
        "ab",
        allow_abbrev=False,
        parents=[verbose_after],
        help="A/B experiment between controllers or reward modes on Ray Tune, with exact statistics and a report",
        description="Run every (arm, seed) trial of an experiment file in one Ray Tune run, concurrently as resources "
        "allow, started in a recorded random order, PPO trials first (they take longest). Each PPO arm trains, "
        "then every arm runs the same held-out evaluation episodes (greedy policy, or the arm's "
        "heuristic/none/random/fixed controller, a trained checkpoint, or a per-host search over fixed plans; with "
        "`held_out` in the file, on each held-out host, reported per host and pooled) and is scored on a test split "
        "no reward ever reads. Arms are compared seed by seed: exact paired Wilcoxon (the verdict), exact "
        "Mann-Whitney, Hodges-Lehmann differences with intervals, Holm over all pairs. A file made for GPUs runs "
        "on a machine without any too: every trial on the CPUs, said and recorded (envs_on_cpus).",
    )
    ab.add_argument("experiment", metavar="EXPERIMENT.yaml", help="experiment file, e.g. tune_configs/smoke.yaml")
    ab.add_argument("--output", metavar="DIR", help="results folder (default: esper_runs/<experiment name>)")
    ab.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --output without re-running finished trials",
    )
    ab.add_argument(
        "--salvage",
        action="store_true",
        help="with --resume, for a run that was killed (kill -9, a lost machine) rather than stopped: its "
        "tune/ no longer matches tune_files.json, so Tune's pickles there are not loaded. Keep its finished "
        "trials (their JSON results), set the folder aside as tune_salvaged_N/ and run the other trials "
        "again, a PPO trial from its newest checkpoint that matches its own manifest. A run that "
        "stopped cleanly resumes as with --resume alone",
    )
    ab.add_argument(
        "--address",
        metavar="auto|HOST:PORT",
        help="join a running Ray cluster instead of starting a local one (without it, a local one starts "
        "even where `ray start` or RAY_ADDRESS names another)",
    )
    ab.add_argument(
        "--max-concurrent-trials",
        type=int,
        metavar="N",
        help="cap the trials running at once (default: the experiment file's max_concurrent_trials, else "
        "as many as the cluster's CPUs and GPUs fit); a run keeps the cap it started with when resumed",
    )
    ab.add_argument(
        "--envs-per-runner",
        type=int_or_text,
        metavar="N|auto",
        help=AB_ENVS_PER_RUNNER_HELP,
    )
    ab.add_argument(
        "--save",
        action="store_true",
        help="keep every evaluation episode's grown network, of every arm (PPO and baselines), in "
        "OUTPUT/networks/ARM/seedS/episodeI/ (as `eval --save` writes one: esper_ray.load_grown(folder))",
    )
    ab.set_defaults(func=_cmd_ab)


def _add_report(sub: Any, verbose_after: argparse.ArgumentParser) -> None:
    """`esper-ray report`: an A/B run's report, rebuilt."""
    report = sub.add_parser(
        "report",
        allow_abbrev=False,
        parents=[verbose_after],
        help="rebuild an A/B report from a finished or partial run",
        description="Read a run folder of `esper-ray ab` and (re)write results.json, report.md and the plots.",
    )
    report.add_argument(
        "run_dir", metavar="RUN_DIR", help="the folder `esper-ray ab` wrote (holds experiment.json and tune/)"
    )
    report.set_defaults(func=_cmd_report)


def remote_error_line(err: BaseException) -> str:
    """The innermost error of a failed Ray actor or task, as its one `SomeError: message` line."""
    inner: BaseException = err
    while True:
        cause = getattr(inner, "cause", None) or inner.__cause__
        if not isinstance(cause, BaseException) or cause is inner:
            break
        inner = cause
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b[^:]*:", line):
            return line
    return lines[-1] if lines else type(inner).__name__


def working_folder_on_path() -> None:
    """Plug-in modules (--plugins, `plugins:`) are found in the folder the command runs in, as `python -m` and
    uvicorn (--app-dir .) find theirs: the console script's sys.path holds its own bin folder instead. Appended, so an
    installed package is never shadowed by a file of the same name there. Ray's local workers get the driver's
    working folder on their sys.path too (ray.init's py_driver_sys_path), so they import the same module."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"
    working_folder_on_path()
    try:
        with ctrl_c_deferred():  # every command needs torch, whose import a Ctrl-C must not cut (deferred_interrupt.py)
            import torch  # noqa: F401
        return int(args.func(args))
    except (
        ValueError,
        FileNotFoundError,
        FileExistsError,
    ) as err:  # bad settings or missing data: one clear line, no traceback
        parser.exit(2, f"esper-ray {args.command}: error: {err}\n")
    except (
        KeyboardInterrupt
    ):  # or SIGTERM outside the rounds, e.g. while the algorithm is built (train/process/termination.py)
        if sigterm_received():
            parser.exit(TERMINATED_EXIT_CODE, f"esper-ray {args.command}: terminated (SIGTERM)\n")
        parser.exit(130, f"esper-ray {args.command}: interrupted\n")
    except Exception as err:
        ray_exceptions = sys.modules.get("ray.exceptions")  # a Ray error needs Ray imported; `host` never imports it
        if ray_exceptions is None or not isinstance(err, ray_exceptions.RayError):
            raise
        parser.exit(
            1,
            f"esper-ray {args.command}: error in a Ray worker: {remote_error_line(err)}\n"
            "(run with --verbose to see the workers' logs)\n",
        )


if __name__ == "__main__":
    sys.exit(main())
