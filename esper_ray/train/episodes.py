"""Run whole episodes with any controller and summarise them the same way (heuristic, greedy PPO, eval)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

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
    rolled_back: bool
    """The episode ended early, by a governor rollback (a full run ends after max_epochs)."""
    seconds: float
    test_accuracy: float | None = None
    """Final model's accuracy on the held-out test split (measured only by evaluations)."""
    test_loss: float | None = None

    @property
    def total_params(self) -> int:
        return self.host_params + self.params_added

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_episode(
    env: MorphogeneticEnv,
    controller: Controller,
    episode: int,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    *,
    reset_seed: int | None = None,
    measure_test: bool = False,
) -> EpisodeSummary:
    """One whole episode; `measure_test` adds the final model's held-out test accuracy (evaluations only)."""
    start = time.perf_counter()
    obs, info = env.reset(seed=reset_seed)
    controller.reset()
    initial = float(info["val_accuracy"])
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(controller.act(obs))
        total += reward
        steps += 1
        if on_step is not None:
            on_step(steps, info)
        if terminated or truncated:
            break
    test_accuracy, test_loss = env.measure_test() if measure_test else (None, None)
    return EpisodeSummary(
        episode=episode, steps=steps, episode_return=total, initial_accuracy=initial,
        final_accuracy=float(info["val_accuracy"]), host_params=int(info["host_params"]),
        params_added=int(info["seed_params"]), germinated=int(info["count/germinated"]),
        fossilized=int(info["count/fossilized"]), pruned=int(info["count/pruned"]),
        rollbacks=int(info["count/rollbacks"]), rolled_back=bool(info["rollback"]), seconds=time.perf_counter() - start,
        test_accuracy=test_accuracy, test_loss=test_loss,
    )


def run_episodes(env: MorphogeneticEnv, controller: Controller, episodes: int, progress: bool,
                 measure_test: bool = False) -> list[EpisodeSummary]:
    """`episodes` episodes in a row, with a progress bar of their epochs on stderr (tqdm; off when not a terminal)."""
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: must be >= 1")
    summaries: list[EpisodeSummary] = []
    with tqdm(total=episodes * env.cfg.max_epochs, unit="epoch", disable=None if progress else True, leave=False) as bar:

        def on_step(step: int, info: dict[str, Any]) -> None:
            bar.set_description(f"episode {len(summaries) + 1}/{episodes}", refresh=False)
            bar.set_postfix_str(f"val acc {100 * info['val_accuracy']:.1f}%", refresh=False)
            bar.update(1)

        for episode in range(episodes):
            summaries.append(run_episode(env, controller, episode, on_step=on_step, measure_test=measure_test))
            bar.update(episode_end_steps(bar, episode + 1, env.cfg.max_epochs))
    return summaries


def episode_end_steps(bar: tqdm, episodes_done: int, max_epochs: int) -> int:
    """Steps to add so the bar reaches the end of an episode that a rollback ended early."""
    return max(0, episodes_done * max_epochs - bar.n)


def format_summary(s: EpisodeSummary) -> str:
    test = f", test acc {100 * s.test_accuracy:.2f}%" if s.test_accuracy is not None else ""
    return (
        f"episode {s.episode}: final acc {100 * s.final_accuracy:.2f}% (start {100 * s.initial_accuracy:.2f}%){test}, "
        f"params added {s.params_added:,} on a {s.host_params:,}-param host, seeds germinated {s.germinated} / "
        f"fossilized {s.fossilized} / pruned {s.pruned}, return {s.episode_return:.2f}, {s.seconds:.1f}s"
        + (", ended by governor rollback" if s.rolled_back else "")
    )
