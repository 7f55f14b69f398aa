"""`esper-ray train`: connect to Ray, build PPO, run rounds, report, checkpoint (every N, at the end, on Ctrl-C).

Output folder:
    config.json                 the TrainConfig
    metrics.jsonl               one RoundSummary per round
    tensorboard/                every numeric result of every round (`tensorboard --logdir OUTPUT`)
    checkpoints/round_NNNNN/    RLlib checkpoints (weights, optimizer, observation-filter state) + train_config.json
    checkpoints/latest.json     which checkpoint is newest

With `placement: SPREAD` the algorithm runs in a driver actor whose placement group spreads env runners and
learners over nodes (algorithm_host.py); with PACK (default) it runs in this process.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
import ray
from tensorboardX import SummaryWriter

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.algorithm_host import AlgorithmHandle
from esper_ray.train.round_summary import RoundSummary, flatten_numbers, progress_line, summarize_round

TRAIN_CONFIG_FILE = "train_config.json"
LATEST_FILE = "latest.json"


@dataclass(frozen=True)
class TrainingOutcome:
    rounds: list[RoundSummary]
    checkpoint: Path
    output: Path
    interrupted: bool
    seconds: float


def required_resources(cfg: TrainConfig) -> tuple[float, float]:
    """(CPUs, GPUs) the run's actors ask for (learners=0 runs the learner in this process)."""
    cpus = cfg.envs * cfg.cpus_per_env + cfg.learners * cfg.effective_learner_cpus
    gpus = cfg.envs * cfg.gpus_per_env + cfg.learners * cfg.learner_gpus
    return cpus, gpus


def connect_ray(cfg: TrainConfig) -> None:
    """Join `cfg.address`, or start a local Ray sized for the run; then check the GPUs are there."""
    cpus, gpus = required_resources(cfg)
    if not ray.is_initialized():
        if cfg.address is not None:
            ray.init(address=cfg.address)
        else:
            # Logical CPUs may exceed the cores: env runners then share them, which is slower but works.
            ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(cpus)))
    available = ray.cluster_resources().get("GPU", 0.0)  # the key is absent on a cluster without GPUs
    if gpus > available + 1e-9:
        raise ValueError(
            f"gpus_per_env={cfg.gpus_per_env} with {cfg.envs} envs and learner_gpus={cfg.learner_gpus} with "
            f"{cfg.learners} learners needs {gpus:g} GPUs and {available:g} were found. Lower gpus_per_env "
            f"(0.25 puts four envs on a GPU), use fewer --envs, or join a cluster with GPUs (--address)."
        )


def checkpoint_round(algo: AlgorithmHandle, cfg: TrainConfig, output: Path) -> Path:
    round_ = algo.iteration()
    path = output / "checkpoints" / f"round_{round_:05d}"
    algo.save(path)
    (path / TRAIN_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
    (output / "checkpoints" / LATEST_FILE).write_text(json.dumps({"round": round_, "path": str(path.resolve())}))
    return path


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a training output folder (then its newest checkpoint)."""
    path = Path(path).expanduser()
    if (path / TRAIN_CONFIG_FILE).is_file():
        return path
    latest = path / "checkpoints" / LATEST_FILE
    if latest.is_file():
        return Path(json.loads(latest.read_text())["path"])
    raise FileNotFoundError(
        f"no esper-ray checkpoint at {path}: expected {TRAIN_CONFIG_FILE} in it (a checkpoint folder) or "
        f"checkpoints/{LATEST_FILE} (a training output folder)"
    )


def load_checkpoint_config(checkpoint: Path) -> TrainConfig:
    return TrainConfig.from_mapping(json.loads((checkpoint / TRAIN_CONFIG_FILE).read_text()))


def run_training(
    cfg: TrainConfig,
    resume: Path | None = None,
    log: Callable[[str], None] = print,
) -> TrainingOutcome:
    start = time.perf_counter()
    output = Path(cfg.output).expanduser().resolve()
    (output / "checkpoints").mkdir(parents=True, exist_ok=True)
    (output / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    connect_ray(cfg)
    algo = AlgorithmHandle(cfg, resume)
    if resume is not None:
        log(f"resumed from {resume} at round {algo.iteration()}")
    nodes = algo.env_runner_nodes()
    log(f"placement {cfg.placement}: {len(nodes)} env runners on {len(set(nodes))} node(s)")
    writer = SummaryWriter(str(output / "tensorboard"))
    summaries: list[RoundSummary] = []
    checkpoint: Path | None = None
    interrupted = False
    try:
        with (output / "metrics.jsonl").open("a") as metrics_file:
            while algo.iteration() < cfg.rounds:
                result = algo.train()
                summary = summarize_round(result)
                summaries.append(summary)
                log(progress_line(summary, cfg.rounds))
                metrics_file.write(json.dumps(summary.as_dict()) + "\n")
                metrics_file.flush()
                for key, value in flatten_numbers(result).items():
                    if math.isfinite(value):  # e.g. a mean over no episodes this round
                        writer.add_scalar(key, value, summary.round)
                if cfg.checkpoint_every and summary.round % cfg.checkpoint_every == 0:
                    checkpoint = checkpoint_round(algo, cfg, output)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: saving a checkpoint of the last finished round")
    finally:
        writer.close()
        if checkpoint is None or not checkpoint.name.endswith(f"{algo.iteration():05d}"):
            checkpoint = checkpoint_round(algo, cfg, output)
        algo.stop()
    return TrainingOutcome(summaries, checkpoint, output, interrupted, time.perf_counter() - start)


def format_outcome(outcome: TrainingOutcome) -> str:
    lines = [f"{'interrupted after' if outcome.interrupted else 'finished'} {len(outcome.rounds)} rounds in {outcome.seconds:.0f}s"]
    if outcome.rounds:
        first, last = outcome.rounds[0], outcome.rounds[-1]
        steps = sum(r.env_steps for r in outcome.rounds)
        busy = sum(r.seconds for r in outcome.rounds)
        lines.append(
            f"  final host accuracy: first round {100 * first.final_accuracy:.1f}%, last round {100 * last.final_accuracy:.1f}%; "
            f"episode return {first.episode_return:.2f} -> {last.episode_return:.2f}"
        )
        lines.append(f"  {steps} env steps, {steps / busy:.1f} steps/s, {busy / len(outcome.rounds):.1f}s per round")
    lines.append(f"  checkpoint: {outcome.checkpoint}")
    lines.append(f"  metrics: {outcome.output / 'metrics.jsonl'}; TensorBoard: tensorboard --logdir {outcome.output / 'tensorboard'}")
    return "\n".join(lines)
