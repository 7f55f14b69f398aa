"""Run whole episodes with any controller and summarise them the same way (heuristic, greedy PPO, eval)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from esper_ray.env.morphogenetic_env import MorphogeneticEnv


class Controller(Protocol):
    def reset(self) -> None: ...

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray: ...


@dataclass(frozen=True)
class EpisodeSummary:
    episode: int
    steps: int
    episode_return: float
    initial_accuracy: float
    final_accuracy: float
    host_params: int
    params_added: int
    germinated: int
    fossilized: int
    pruned: int
    rollbacks: int
    terminated: bool
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_episode(
    env: MorphogeneticEnv,
    controller: Controller,
    episode: int,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
) -> EpisodeSummary:
    start = time.perf_counter()
    obs, info = env.reset()
    controller.reset()
    initial = float(info["val_accuracy"])
    total, steps, terminated = 0.0, 0, False
    while True:
        obs, reward, terminated, truncated, info = env.step(controller.act(obs))
        total += reward
        steps += 1
        if on_step is not None:
            on_step(steps, info)
        if terminated or truncated:
            break
    return EpisodeSummary(
        episode=episode, steps=steps, episode_return=total, initial_accuracy=initial,
        final_accuracy=float(info["val_accuracy"]), host_params=int(info["host_params"]),
        params_added=int(info["seed_params"]), germinated=int(info["count/germinated"]),
        fossilized=int(info["count/fossilized"]), pruned=int(info["count/pruned"]),
        rollbacks=int(info["count/rollbacks"]), terminated=bool(terminated), seconds=time.perf_counter() - start,
    )


def run_episodes(env: MorphogeneticEnv, controller: Controller, episodes: int, progress: bool) -> list[EpisodeSummary]:
    """`episodes` episodes in a row, with a progress line on stderr."""
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: must be >= 1")
    bar = ProgressLine(episodes, env.cfg.max_epochs, enabled=progress)
    summaries = []
    for episode in range(episodes):
        summaries.append(run_episode(env, controller, episode, on_step=bar.step))
        bar.episode_done()
    return summaries


class ProgressLine:
    """A one-line progress display on stderr (rewritten in place on a terminal, throttled otherwise)."""

    def __init__(self, total_episodes: int, max_epochs: int, enabled: bool = True) -> None:
        self.total_episodes, self.max_epochs, self.enabled = total_episodes, max_epochs, enabled
        self.tty = sys.stderr.isatty()
        self.episode = 0

    def step(self, step: int, info: dict[str, Any]) -> None:
        if not self.enabled or (not self.tty and step % 10 and step != self.max_epochs):
            return
        done = (self.episode * self.max_epochs + step) / (self.total_episodes * self.max_epochs)
        bar = "#" * int(20 * done) + "-" * (20 - int(20 * done))
        line = (f"[{bar}] episode {self.episode + 1}/{self.total_episodes} epoch {step}/{self.max_epochs} "
                f"val acc {100 * info['val_accuracy']:.1f}%")
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def episode_done(self) -> None:
        self.episode += 1
        if self.enabled and self.tty:
            print(file=sys.stderr)


def format_summary(s: EpisodeSummary) -> str:
    return (
        f"episode {s.episode}: final acc {100 * s.final_accuracy:.2f}% (start {100 * s.initial_accuracy:.2f}%), "
        f"params added {s.params_added:,} on a {s.host_params:,}-param host, seeds germinated {s.germinated} / "
        f"fossilized {s.fossilized} / pruned {s.pruned}, return {s.episode_return:.2f}, {s.seconds:.1f}s"
        + (", ended by governor rollback" if s.terminated else "")
    )
