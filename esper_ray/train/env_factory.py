"""The env class RLlib instantiates in each env runner: shard k of n is chosen by the runner's index, and torch
uses as many threads as the runner was given CPUs (several env processes sharing cores otherwise fight over
them: `heuristic` ran 3.5-5x faster beside other envs with one thread)."""

from __future__ import annotations

import math
from typing import Any

import ray
import torch
from ray.rllib.env.env_context import EnvContext

from esper_ray.env.morphogenetic_env import MorphogeneticEnv


def shard_of(context: EnvContext) -> tuple[int, int]:
    """Remote env runners are numbered 1..n (index 0 is the driver's local runner, used only without remotes)."""
    return max(context.worker_index - 1, 0), max(context.num_workers, 1)


def threads_for_this_worker() -> int | None:
    """floor(CPUs Ray assigned to this worker), at least 1; None outside a Ray worker."""
    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return None
    return max(1, math.floor(context.get_assigned_resources().get("CPU", 1.0)))


class ShardedMorphogeneticEnv(MorphogeneticEnv):
    def __init__(self, config: EnvContext | dict[str, Any]) -> None:
        settings = dict(config)
        if isinstance(config, EnvContext):
            settings["shard"], settings["num_shards"] = shard_of(config)
        threads = threads_for_this_worker()
        if threads is not None:
            torch.set_num_threads(threads)
        super().__init__(settings)
