"""`esper-ray heuristic`: run the heuristic controller for some episodes and summarise each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.policy.heuristic import HeuristicController
from esper_ray.train.episodes import EpisodeSummary, ProgressLine, run_episode


def run_heuristic(env_config: Mapping[str, Any], episodes: int, progress: bool = True) -> list[EpisodeSummary]:
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: must be >= 1")
    env = MorphogeneticEnv(env_config)
    controller = HeuristicController(env.slot_ids, env.cfg.max_epochs)
    bar = ProgressLine(episodes, env.cfg.max_epochs, enabled=progress)
    summaries = []
    for episode in range(episodes):
        summaries.append(run_episode(env, controller, episode, on_step=bar.step))
        bar.episode_done()
    return summaries
