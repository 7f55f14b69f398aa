"""`esper-ray grow`: a trained controller grows a host it may never have seen, and the network is kept.

No RL: the checkpoint's policy is frozen and makes every decision of ONE host training run (greedy, or sampled
with `--sample`), in this process, without Ray. The host is a registered name or a `package.module:HostClass`
import string; the run takes the checkpoint's env settings (lifecycle, epochs, reward) with the host, its task
and its slots put in, then `--env` on top. The network is written as `eval --save` writes one (train/commands/grow.py).

Everything a run could be refused for is checked before the host trains: the host and task names, the policy's
fit to the host (evaluate.check_policy_fits) and the folder the network goes to.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper_ray.contracts import registry
from esper_ray.contracts.fields import parse_env_overrides, shared_name
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.formatting import clock_stamp, time_left
from esper_ray.morpho.hosts import build_host
from esper_ray.train.commands.episodes import EpisodeHistory, EpisodeSummary, format_summary, run_episode
from esper_ray.train.commands.evaluate import (
    GreedyPolicyController,
    check_policy_fits,
    load_policy,
    untrained_positions_line,
)
from esper_ray.train.commands.grow import check_save_folder, save_grown_run, saved_line
from esper_ray.train.folders.checkpoints import (
    in_a_run,
    load_checkpoint_config,
    resolve_checkpoint,
    round_of,
    run_folder_of,
)
from esper_ray.train.folders.run_lock import writable_folder
from esper_ray.train.output.progress_lines import warn
from esper_ray.train.process.threads import COMMAND_THREADS, use_threads

TASK_BOUND_ENV_KEYS = ("batch_size", "host_lr", "augment", "val_batch_size", "data_dir", "text_max_bytes")
"""Checkpoint env settings that belong to its task's data: dropped when the run grows on another task (the new
task's defaults apply; `--env` sets them again)."""
GROWN_FOLDER = "grown"
"""The default --save lies in RUN/grown/ (or ./grown/ where the run folder cannot be written)."""
PROGRESS_LINES = 10
"""About this many progress lines a run, whatever its length (and always the last epoch's)."""


@dataclass(frozen=True)
class GrowRequest:
    checkpoint: str
    host: str
    task: str | None = None
    plugins: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """--env KEY=VALUE pairs, on top of the checkpoint's env settings."""
    seed: int | None = None
    save: str | None = None
    sample: bool = False
    threads: int = COMMAND_THREADS


class SampledPolicyController(GreedyPolicyController):
    """Draws each action from the policy's masked distribution, from a generator of its own: the draws depend on
    `seed` only, not on what the env does with torch's global generator between decisions."""

    def __init__(self, *args: Any, seed: int, **kwargs: Any) -> None:
        self.rng = np.random.default_rng(seed)
        super().__init__(*args, **kwargs)

    def choose(self, dist: Any) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.rng.integers(2**63 - 1)))
            return dist.sample()


def grow_env_config(
    base: Mapping[str, Any],
    checkpoint_slots: Sequence[str],
    host: str,
    task: str | None,
    plugins: Sequence[str],
    overrides: Mapping[str, Any],
    seed: int | None,
) -> dict[str, Any]:
    """The env settings of the grow run: the checkpoint's (`base`), with the host, its task, its slots and the
    plugins put in, then `overrides` (--env) and `seed`. Names that are unknown raise ValueError listing the known.

    The task: --task, else the checkpoint's when the host is one of that task's own, else the first task that
    lists the host as its own; a host that no task lists (an import string) needs --task. The slots: the
    checkpoint's where the host has them all (its own training host, say), else every slot the host declares.
    """
    registry.load_plugins(plugins)
    registry.host(host, field="--host")  # an unknown name lists the registered ones; an import string registers itself
    if task is None:
        owners = [t for t in registry.task_names() if host in registry.task(t).hosts]
        if not owners:
            raise ValueError(
                f"--host {host}: no registered task lists it as its own host; name the data it grows "
                f"on with --task (one of {registry.task_names()}, or a package.module:loader)"
            )
        task = base["task"] if base["task"] in owners else owners[0]
    else:
        try:
            registry.task(task)
        except ValueError as err:
            raise ValueError(f"--task: {err}") from None
    host_slots = build_host(host).slot_ids
    slots = list(checkpoint_slots) if set(checkpoint_slots) <= set(host_slots) else list(host_slots)
    config = {k: v for k, v in base.items() if (task == base["task"] or k not in TASK_BOUND_ENV_KEYS) and k != "family"}
    config.update(task=task, host_preset=host, plugins=list(plugins), slots=slots, **overrides)
    if seed is not None:
        config["seed"] = seed
    return config


def default_save_folder(checkpoint: Path, host: str, seed: int) -> Path:
    """A new, empty folder for the network: RUN/grown/HOST-seedS, numbered -2, -3, ... past any that exists, so no
    network is ever written over; under the current folder when the run folder cannot be written or the checkpoint
    lies in none. Created here (mkdir that fails on an existing folder: two grow commands never pick the same one)."""
    name = re.sub(r"[^\w.-]+", "-", host).strip("-") + f"-seed{seed}"
    # a checkpoint on its own (a shipped controller) has no run folder: its parent may be anything, a repository's docs
    roots = [run_folder_of(checkpoint) / GROWN_FOLDER] if in_a_run(checkpoint) else []
    for root in (*roots, Path.cwd() / GROWN_FOLDER):
        try:
            writable_folder(root, "--save")
        except ValueError:
            continue
        n = 1
        while True:
            folder = root / (name if n == 1 else f"{name}-{n}")
            try:
                folder.mkdir()
                return folder.resolve()
            except FileExistsError:
                n += 1
    tried = [str(root) for root in (*roots, Path.cwd() / GROWN_FOLDER)]
    what = f"neither {tried[0]} nor {tried[1]} can" if len(tried) == 2 else f"{tried[0]} cannot"
    raise ValueError(f"no folder to keep the network in: {what} be written; give --save DIR")


class GrowProgress:
    """One line every few epochs (about PROGRESS_LINES a run): epoch, validation accuracy, seeds planted and
    committed (fossilized), the time left."""

    def __init__(self, max_epochs: int) -> None:
        self.max_epochs = max_epochs
        self.every = max(1, math.ceil(max_epochs / PROGRESS_LINES))
        self.start = time.monotonic()

    def epoch(self, epoch: int, info: Mapping[str, Any]) -> None:
        if epoch % self.every and epoch != self.max_epochs and not info.get("rollback"):
            return
        elapsed = time.monotonic() - self.start
        left = time_left(elapsed, epoch, self.max_epochs) if elapsed >= 1 else ""  # a run of a second needs no estimate
        print(
            f"{clock_stamp(elapsed)} grow: epoch {epoch}/{self.max_epochs}: "
            f"val acc {100 * float(info['val_accuracy']):.1f}%, "
            f"seeds planted {int(info['count/germinated'])}, committed {int(info['count/fossilized'])}, "
            f"pruned {int(info['count/pruned'])}" + (f"; {left}" if left else ""),
            flush=True,
        )


def run_grow(request: GrowRequest) -> tuple[EpisodeSummary, Path]:
    """`esper-ray grow`: check everything, grow the host once with the checkpoint's policy, keep the network.
    Returns the run's summary and the folder the network is in."""
    use_threads(request.threads)
    checkpoint = resolve_checkpoint(request.checkpoint)
    cfg = load_checkpoint_config(checkpoint)
    plugins = list(dict.fromkeys([*cfg.plugins, *request.plugins]))  # the checkpoint's own, then the user's
    env_config = grow_env_config(
        cfg.env_config(shard=0, num_shards=1),
        cfg.slots,
        request.host,
        request.task,
        plugins,
        parse_env_overrides(list(request.env)),
        request.seed,
    )
    created = request.save is None or not Path(request.save).expanduser().exists()
    folder = check_save_folder(request.save, 1) if request.save is not None else None  # before the env loads any data
    try:
        env = MorphogeneticEnv(env_config)
        check_policy_fits(checkpoint, env)
        module, feature_filter = load_policy(checkpoint)
        if folder is None:
            folder = default_save_folder(checkpoint, request.host, env.cfg.seed)
        controller = (
            SampledPolicyController(module, feature_filter, seed=env.cfg.seed)
            if request.sample
            else GreedyPolicyController(module, feature_filter)
        )
        how = "sampled" if request.sample else "greedy"
        name = shared_name(checkpoint)
        print(
            f"esper-ray grow: {how} policy of checkpoint {checkpoint} (round {round_of(checkpoint)}) grows host "
            f"{env.cfg.effective_host_preset} ({env.topology.value}; slots {', '.join(env.slot_ids)}) on task "
            f"{env.cfg.task}, {env.cfg.max_epochs} epochs, env seed {env.cfg.seed}; the network goes to {folder}",
            flush=True,
        )
        warn("grow", env.base_cfg.short_run_warning())
        warn("grow", untrained_positions_line(cfg.env, env.base_cfg, cfg.policy))
        history = EpisodeHistory()
        summary = run_episode(
            env, controller, 0, GrowProgress(env.cfg.max_epochs).epoch, measure_test=True, history=history
        )
        save_grown_run(folder, env, summary, history, f"the {how} PPO policy of checkpoint {name}", name)
    except BaseException:  # refused or stopped before anything was kept: leave no empty folder of ours behind
        if created and folder is not None and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise
    print(format_summary(summary))
    print(saved_line(folder))
    return summary, folder
