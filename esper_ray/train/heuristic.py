"""`esper-ray heuristic`: run the heuristic controller for some episodes and summarise each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.policy.heuristic import HeuristicController
from esper_ray.train.episodes import EpisodeSummary, run_episodes


def run_heuristic(env_config: Mapping[str, Any], episodes: int, progress: bool = True) -> list[EpisodeSummary]:
    env = MorphogeneticEnv(env_config)
    return run_episodes(env, HeuristicController(env.slot_ids, env.cfg.max_epochs, topology=env.topology.value), episodes, progress)
