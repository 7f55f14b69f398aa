"""`esper-ray train`: connect to Ray, check the run fits, build PPO, run rounds, report, checkpoint.

Checkpoints are written every `checkpoint_every` rounds and at the end (folder layout: checkpoints.py). One
Ctrl-C stops the run within seconds: the env runners are killed mid-round (their partial round is lost, as it
would be anyway), the last finished round is saved if it was not yet, and the command exits with 130. SIGTERM
does the same and exits with 143 (termination.py).

With `placement: SPREAD` the algorithm runs in a driver actor whose placement group spreads env runners and
learners over nodes (algorithm_host.py); with PACK (default) it runs in this process.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ray
from tensorboardX import SummaryWriter

from esper_ray.contracts.envs_split import AUTO, auto_why, split_line
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.formatting import counted, time_left
from esper_ray.train.folders.checkpoints import (
    checkpoint_dir,
    holds_a_run,
    latest_round,
    partial_checkpoint_dir,
    record_checkpoint,
    run_folder_of,
)
from esper_ray.train.folders.manifest import write_atomically
from esper_ray.train.folders.run_lock import run_folder_lock
from esper_ray.train.output.progress import RoundBar, start_step_counter
from esper_ray.train.output.round_summary import RoundSummary, planted_most, progress_line, summarize_round
from esper_ray.train.output.tensorboard_log import log_config, log_round
from esper_ray.train.output.viewer_hints import tensorboard_command
from esper_ray.train.process.mps import mps_daemons, mps_environment, new_run_id
from esper_ray.train.process.preflight import check_env_config
from esper_ray.train.process.resources import check_fits, connect_ray
from esper_ray.train.process.termination import received as sigterm_received
from esper_ray.train.process.termination import sigterm_raises_terminated
from esper_ray.train.rllib.algorithm_host import AlgorithmHandle
from esper_ray.train.rllib.step_failures import FAILURES_LOG, append_tracebacks, round_failures, traceback_report


@dataclass(frozen=True)
class TrainingOutcome:
    rounds: list[RoundSummary]
    checkpoint: Path | None
    """Newest checkpoint (None when the run was interrupted before its first round finished)."""
    output: Path
    interrupted: bool
    """Stopped by Ctrl-C or SIGTERM before its last round."""
    seconds: float
    terminated: bool = False
    """Stopped by SIGTERM (a job manager's stop), not by Ctrl-C."""


def save_round(algo: AlgorithmHandle, cfg: TrainConfig, output: Path) -> Path:
    """Checkpoint the finished round: RLlib writes a partial folder, which becomes the round's once complete."""
    round_ = algo.iteration()
    partial = partial_checkpoint_dir(output, round_)
    algo.save(partial)
    return record_checkpoint(output, cfg, partial, round_)


def run_training(
    cfg: TrainConfig,
    output: Path,
    resume: Path | None = None,
    log: Callable[[str], None] = print,
    on_result: Callable[[dict], None] | None = None,
    env_checked: bool = False,
) -> TrainingOutcome:
    """Train `cfg.rounds` rounds in total into `output` (a fresh folder, or the resumed run's own), its only writer
    while it runs (run_lock.py). `env_checked`: the caller ran check_env_config (the CLI does, before Ray is
    imported)."""
    start = time.perf_counter()
    output = output.expanduser().resolve()
    if not env_checked:
        check_env_config(cfg)  # a bad env setting fails here, once, not in every env runner
    mps_env = mps_environment(new_run_id()) if cfg.mps else None
    with contextlib.ExitStack() as stack:
        # Before Ray starts, and checked again under the lock: another command may have begun a run there since.
        stack.enter_context(run_folder_lock(output))
        in_place = resume is not None and run_folder_of(resume).resolve() == output
        if holds_a_run(output) and not in_place:
            raise FileExistsError(
                f"{output} already holds a run: add --resume {shlex.quote(str(output))} to continue "
                "it, or choose another --output"
            )
        connect_ray(cfg.address, log, env_vars=mps_env)
        stack.enter_context(sigterm_raises_terminated())  # after ray.init: it replaces the core worker's handler
        if cfg.envs_per_runner == AUTO:  # the CLI decides before Ray starts where it can (local Ray: os.cpu_count)
            cores = ray.cluster_resources().get("CPU", 1.0)
            cfg = cfg.resolved(cores)
            log(f"envs: {split_line(cfg.envs, cfg.runner_envs, auto_why(cores, cfg.gpus_per_env > 0))}")
        check_fits(cfg, local=cfg.address is None, log=log)
        if mps_env is not None:
            nodes = stack.enter_context(mps_daemons(mps_env))
            log(f"MPS: a private daemon on {len(nodes)} GPU node(s), pipe folder {mps_env['CUDA_MPS_PIPE_DIRECTORY']}")
        summaries, interrupted = _train_rounds(cfg, output, resume, log, on_result)
    checkpoint = None
    if latest_round(output) is not None:
        checkpoint = checkpoint_dir(output, latest_round(output))  # type: ignore[arg-type]
    return TrainingOutcome(
        summaries,
        checkpoint,
        output,
        interrupted,
        time.perf_counter() - start,
        terminated=interrupted and sigterm_received(),
    )


def _train_rounds(
    cfg: TrainConfig,
    output: Path,
    resume: Path | None,
    log: Callable[[str], None],
    on_result: Callable[[dict], None] | None,
) -> tuple[list[RoundSummary], bool]:
    """The rounds, and whether Ctrl-C or SIGTERM stopped them early."""
    (output / "checkpoints").mkdir(parents=True, exist_ok=True)
    (output / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    counter_name, counter = start_step_counter()
    algo = AlgorithmHandle(cfg, resume, counter_name)
    if resume is not None:
        log(f"resumed from {resume} at round {algo.iteration()}")
    nodes = algo.env_runner_nodes()
    log(f"placement {cfg.placement}: {len(nodes)} env runners on {len(set(nodes))} node(s)")
    # A resumed run replays the rounds after its checkpoint: the folder's records of those rounds (written
    # before a kill -9, or by the old run when resumed from an earlier checkpoint) give way to the replay's.
    keep_rounds_up_to(output / "metrics.jsonl", algo.iteration())
    # purge_step: TensorBoard drops the events of earlier files at steps >= it, so each round is drawn once (a
    # resumed run's, or a new run's in a folder a run killed before its first checkpoint left: checkpoints.py)
    replaces = resume is not None or (output / "tensorboard").exists()
    writer = SummaryWriter(str(output / "tensorboard"), purge_step=algo.iteration() + 1 if replaces else None)
    log_config(writer, cfg, algo.iteration())
    log(f"TensorBoard: {tensorboard_command(output / 'tensorboard')}")
    summaries: list[RoundSummary] = []
    interrupted = False
    # The round this run's folder holds a checkpoint of, from this run: None until one is saved, unless the run
    # resumed from the folder's newest. Not latest.json's round alone: resumed in place from an earlier
    # checkpoint, latest.json names a later round of the old run, which the new run's rounds must replace.
    saved = algo.iteration() if latest_round(output) == algo.iteration() else None
    first_round, started = (
        algo.iteration(),
        time.perf_counter(),
    )  # the estimate of the time left counts this run's rounds
    try:
        with (output / "metrics.jsonl").open("a") as metrics_file:
            while algo.iteration() < cfg.rounds:
                with RoundBar(counter, algo.iteration() + 1, cfg.rounds, cfg.episode_steps_per_round):
                    result = algo.train()
                summary = summarize_round(result)
                summaries.append(summary)
                if on_result is not None:
                    on_result(result)
                metrics_file.write(json.dumps(summary.as_dict()) + "\n")
                metrics_file.flush()
                log_round(writer, result, summary.round)
                failures = round_failures(result)
                if failures:  # the round line names the errors; their tracebacks go to the log file and TensorBoard
                    failures_log = append_tracebacks(output, summary.round, failures)
                    report = textwrap.indent(
                        traceback_report(summary.round, failures), "    "
                    )  # Markdown: preformatted
                    writer.add_text("env_step_failures", report, summary.round)
                # printed once recorded: a Ctrl-C at the sight of a round's line loses none of that round
                left = time_left(time.perf_counter() - started, summary.round - first_round, cfg.rounds - first_round)
                log(progress_line(summary, cfg.rounds) + (f" | {left}" if left else ""))
                if failures:
                    log(f"  tracebacks: {failures_log}")
                if cfg.checkpoint_every and summary.round % cfg.checkpoint_every == 0:
                    save_round(algo, cfg, output)
                    saved = summary.round
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (termination.py)
        interrupted = True
        what = "terminated (SIGTERM)" if sigterm_received() else "interrupted"
        log(f"{what}: stopping the env runners and keeping the last finished round")
    finally:
        writer.close()
        try:
            done = algo.iteration()
            if done > 0 and done != saved:
                save_round(algo, cfg, output)
        finally:
            algo.stop(abort=interrupted)
            if counter is not None:
                ray.kill(counter)
    return summaries, interrupted


def keep_rounds_up_to(metrics: Path, done: int) -> None:
    """Drop the lines of rounds after `done` from metrics.jsonl (atomically), so that each round is there once.
    A line cut short by a kill is dropped too."""
    if not metrics.is_file():
        return
    kept = []
    for line in metrics.read_text().splitlines():
        try:
            round_ = json.loads(line)["round"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(round_, int) and round_ <= done:
            kept.append(line)
    write_atomically(metrics, "".join(line + "\n" for line in kept))


BLOCK_ROUNDS = 10
"""Rounds a block of the summary's accuracy means: one round's few episodes swing by 10-20 points, so a first and a
last round side by side read as progress where there is none (issue 74)."""


def accuracy_by_block(rounds: list[RoundSummary]) -> str:
    """The rollouts' final host accuracy as means of blocks of BLOCK_ROUNDS rounds."""
    blocks = [rounds[i : i + BLOCK_ROUNDS] for i in range(0, len(rounds), BLOCK_ROUNDS)]
    means = ", ".join(
        f"rounds {b[0].round}-{b[-1].round} {100 * sum(r.final_accuracy for r in b) / len(b):.1f}%" for b in blocks
    )
    return (
        f"final host accuracy, mean of each block of {BLOCK_ROUNDS} rounds "
        f"(one round's swings by 10-20 points): {means}"
    )


def format_outcome(outcome: TrainingOutcome) -> str:
    verb = (
        "terminated (SIGTERM) after"
        if outcome.terminated
        else "interrupted after"
        if outcome.interrupted
        else "finished"
    )
    lines = [f"{verb} {counted(len(outcome.rounds), 'round')} in {outcome.seconds:.0f}s"]
    if outcome.rounds:
        first, last = outcome.rounds[0], outcome.rounds[-1]
        steps = sum(r.env_steps for r in outcome.rounds)
        busy = sum(r.seconds for r in outcome.rounds)
        lines.append(
            f"  {accuracy_by_block(outcome.rounds)}; episode return {first.episode_return:.2f} -> "
            f"{last.episode_return:.2f}"
        )
        lines.append(f"  {steps} env steps, {steps / busy:.1f} steps/s, {busy / len(outcome.rounds):.1f}s per round")
        top = planted_most(last)
        if top is not None:
            lines.append(
                f"  last round: planted {top[0]} most ({100 * top[1]:.0f} % of germinations), "
                f"{last.fossilized:.1f} seeds kept an episode"
            )
        failed = sum(r.failed_env_steps for r in outcome.rounds)
        if failed:
            lines.append(
                f"  FAILED env steps: {failed}, each losing its episode; tracebacks in {outcome.output / FAILURES_LOG}"
            )
    if outcome.checkpoint is not None:
        lines.append(
            f"  checkpoint: {outcome.checkpoint} "
            f"(resume: esper-ray train --resume {shlex.quote(str(outcome.output))} --rounds N)"
        )
    else:
        lines.append("  no round finished: nothing was saved")
    lines.append(
        f"  metrics: {outcome.output / 'metrics.jsonl'}; "
        f"TensorBoard: {tensorboard_command(outcome.output / 'tensorboard')}"
    )
    return "\n".join(lines)
