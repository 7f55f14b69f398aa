"""`esper-ray heuristic`: run the heuristic controller for some episodes and summarise each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.policy.heuristic import HeuristicConfig, HeuristicController
from esper_ray.train.commands.episodes import EpisodeEnd, EpisodeSummary, run_episodes
from esper_ray.train.process.threads import COMMAND_THREADS, use_threads

CONTROLLER_NAME = "the heuristic controller (`esper-ray heuristic`)"


def run_heuristic(
    env_config: Mapping[str, Any],
    episodes: int,
    progress: bool = True,
    *,
    measure_test: bool = False,
    on_episode_end: EpisodeEnd | None = None,
    threads: int = COMMAND_THREADS,
) -> list[EpisodeSummary]:
    use_threads(threads)
    env = MorphogeneticEnv(env_config)
    controller = PerMemberHeuristic(env)
    return run_episodes(
        env, controller, episodes, progress, measure_test=measure_test, on_episode_end=on_episode_end, label="heuristic"
    )


class PerMemberHeuristic:
    """The heuristic controller for the env's current host: rebuilt at an episode's start when a family's member
    (EnvConfig.family) brings other slots, another run length, topology or lifecycle."""

    def __init__(self, env: MorphogeneticEnv) -> None:
        self.env = env
        self._key: tuple[Any, ...] | None = None
        self.reset()

    def reset(self) -> None:
        key = (tuple(self.env.slot_ids), self.env.cfg.max_epochs, self.env.topology.value, self.env.cfg.lifecycle)
        if key != self._key:
            self._key, self.inner = (
                key,
                HeuristicController(list(key[0]), key[1], HeuristicConfig.for_lifecycle(key[3]), topology=key[2]),
            )
        self.inner.reset()

    def act(self, obs: Any) -> Any:
        return self.inner.act(obs)
