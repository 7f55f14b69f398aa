"""The env RLlib instantiates in each env runner: shard k of n is chosen by the runner's index, and torch uses as many
threads as the runner was given CPUs (threads.py: several env processes sharing cores otherwise fight over them).

With TrainConfig.envs_per_runner = N > 1, RLlib makes the runner's env through `ShardedVectorMorphogeneticEnv` (its
vector_entry_point mode): one VectorMorphogeneticEnv of N envs, runner k's env i on shard k * N + i of runners x N.
RLlib hands that entry point a plain dict (its env context merged with num_envs loses the runner's index), so the
runner puts its index and the number of runners into the env config under RUNNER_KEY (env_runner.py)."""

from __future__ import annotations

import functools
from typing import Any

from ray.rllib.env.env_context import EnvContext

from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.env.vector_env import VectorMorphogeneticEnv
from esper_ray.train.process.threads import ray_cpu_share, use_threads

RUNNER_KEY = "_env_runner"
"""Env-config key of (the runner's worker index, the number of remote runners), for ShardedVectorMorphogeneticEnv."""


def shard_of(context: EnvContext) -> tuple[int, int]:
    """Remote env runners are numbered 1..n (index 0 is the driver's local runner, used only without remotes)."""
    return runner_shard(context.worker_index, context.num_workers)


def runner_shard(worker_index: int, num_workers: int) -> tuple[int, int]:
    return max(worker_index - 1, 0), max(num_workers, 1)


class ShardedVectorMorphogeneticEnv(VectorMorphogeneticEnv):
    """The vector env of one runner: `num_envs` envs on consecutive shards of runners x num_envs. A class, as RLlib
    takes no other callable for its env."""

    def __init__(self, config: dict[str, Any]) -> None:
        settings = dict(config)
        num_envs = int(settings.pop("num_envs"))
        runner, runners = runner_shard(*settings.pop(RUNNER_KEY, (0, 0)))
        threads = ray_cpu_share()
        if threads is not None:
            use_threads(threads)
        first, shards = runner * num_envs, runners * num_envs
        super().__init__(
            [
                functools.partial(MorphogeneticEnv, {**settings, "shard": first + i, "num_shards": shards})
                for i in range(num_envs)
            ]
        )


class ShardedMorphogeneticEnv(MorphogeneticEnv):
    def __init__(self, config: EnvContext | dict[str, Any]) -> None:
        settings = dict(config)
        if isinstance(config, EnvContext):
            settings["shard"], settings["num_shards"] = shard_of(config)
        threads = ray_cpu_share()
        if threads is not None:
            use_threads(threads)
        super().__init__(settings)
