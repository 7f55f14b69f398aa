"""The env class RLlib instantiates in each env runner: shard k of n is chosen by the runner's index, and torch
uses as many threads as the runner was given CPUs (threads.py: several env processes sharing cores otherwise fight
over them)."""

from __future__ import annotations

from typing import Any

from ray.rllib.env.env_context import EnvContext

from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.train.process.threads import ray_cpu_share, use_threads


def shard_of(context: EnvContext) -> tuple[int, int]:
    """Remote env runners are numbered 1..n (index 0 is the driver's local runner, used only without remotes)."""
    return max(context.worker_index - 1, 0), max(context.num_workers, 1)


class ShardedMorphogeneticEnv(MorphogeneticEnv):
    def __init__(self, config: EnvContext | dict[str, Any]) -> None:
        settings = dict(config)
        if isinstance(config, EnvContext):
            settings["shard"], settings["num_shards"] = shard_of(config)
        threads = ray_cpu_share()
        if threads is not None:
            use_threads(threads)
        super().__init__(settings)
