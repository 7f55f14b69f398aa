"""Run whole episodes with any controller and summarise them the same way (heuristic, greedy PPO, eval)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from esper_ray.contracts.stages import LIVE_STAGES, Stage
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.train.output.progress_lines import EpisodeProgress, warn


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
    """Validation accuracy of the committed model when the run ended: the host and its fossilized seeds, what a
    host run keeps (seeds still on probation are dropped; docs/design.md, "The end of a host run")."""
    host_params: int
    params_added: int
    """Parameters of the fossilized seeds: what the kept network adds to the host."""
    germinated: int
    fossilized: int
    pruned: int
    rollbacks: int
    refused: int
    """Actions the env refused (a gate or precondition failed; the slot stayed as it was)."""
    train_flops: int
    """Host and seed training FLOPs of the episode (forward + backward; morpho/flops.py says what counts)."""
    seed_train_flops: int
    """The seeds' part of `train_flops`."""
    validation_flops: int
    """Validation passes of the model as it was each epoch."""
    counterfactual_flops: int
    """The extra configurations of the counterfactual validation (seeds switched off)."""
    rolled_back: bool
    """The episode ended early, by a governor rollback (a full run ends after max_epochs)."""
    seconds: float
    test_accuracy: float | None = None
    """The committed model's accuracy on the held-out test split (measured by evaluations and `esper-ray heuristic`)."""
    test_loss: float | None = None
    final_accuracy_with_probation: float | None = None
    """Validation accuracy with the seeds still on probation in, at their last alpha (= final_accuracy without any)."""
    params_on_probation: int = 0
    """Parameters of the seeds still live (not fossilized) when the run ended: not part of the kept network."""
    test_accuracy_with_probation: float | None = None
    """Held-out test accuracy with the seeds on probation in (where test_accuracy is measured)."""
    family_member: str | None = None
    """The family member the episode ran on (EnvConfig.family; None without one)."""
    torch_threads: int = 0
    """torch's intra-op threads in the process that ran the episode, read at its end (train/process/threads.py)."""
    reset_seed: int | None = None
    """The seed the episode's env.reset got (None: the env drew its own): what pairs host runs across arms."""

    @property
    def total_params(self) -> int:
        return self.host_params + self.params_added

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


HOLDS_A_SEED = LIVE_STAGES | {Stage.FOSSILIZED}


@dataclass(frozen=True)
class SeedEvents:
    """When a slot's current seed was germinated and fossilized: epoch t is the step whose decision came just
    before host epoch t trained (1-based); None if it has not happened."""

    germinated_epoch: int
    fossilized_epoch: int | None = None


class EpisodeHistory:
    """What an episode's infos say epoch by epoch: the accuracy curves and each slot's seed events.

    Index 0 of the validation curve is the host before any training (reset); the training curve has no entry there.
    """

    def __init__(self) -> None:
        self.val_accuracy: list[float] = []
        self.train_accuracy: list[float | None] = []
        self.episode_seed: int | None = None
        """The seed the env drew for this episode's host initialisation and data order."""
        self.seeds: dict[str, SeedEvents] = {}
        """The latest seed of every slot that ever held one (a pruned seed stays until the slot germinates again)."""
        self._stages: dict[str, Stage] = {}

    def record(self, info: Mapping[str, Any]) -> None:
        epoch = int(info["epoch"])
        self.episode_seed = int(info["episode_seed"])
        self.val_accuracy.append(float(info["val_accuracy"]))
        self.train_accuracy.append(float(info["train_accuracy"]) if "train_accuracy" in info else None)
        for slot, name in info["stages"].items():
            stage, before = Stage[name], self._stages.get(slot, Stage.DORMANT)
            if stage in HOLDS_A_SEED and before not in HOLDS_A_SEED:  # only GERMINATE gives a slot a seed
                self.seeds[slot] = SeedEvents(germinated_epoch=epoch)
            if stage is Stage.FOSSILIZED and before is not Stage.FOSSILIZED:
                self.seeds[slot] = replace(self.seeds[slot], fossilized_epoch=epoch)
            self._stages[slot] = stage


EpisodeEnd = Callable[[MorphogeneticEnv, "EpisodeSummary", EpisodeHistory], None]
"""Called after each episode, while the env still holds its final model (to keep the grown network, say)."""


def run_episode(
    env: MorphogeneticEnv,
    controller: Controller,
    episode: int,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    *,
    reset_seed: int | None = None,
    measure_test: bool = False,
    history: EpisodeHistory | None = None,
) -> EpisodeSummary:
    """One whole episode; `measure_test` adds the final model's held-out test accuracy, and
    `history` records its curves and seed events."""
    start = time.perf_counter()
    obs, info = env.reset(seed=reset_seed)
    controller.reset()
    if history is not None:
        history.record(info)
    initial = float(info["val_accuracy"])
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(controller.act(obs))
        total += reward
        steps += 1
        if history is not None:
            history.record(info)
        if on_step is not None:
            on_step(steps, info)
        if terminated or truncated:
            break
    test = env.measure_test() if measure_test else None
    kept = int(info["committed_seed_params"])
    return EpisodeSummary(
        episode=episode,
        steps=steps,
        episode_return=total,
        initial_accuracy=initial,
        final_accuracy=float(info["committed_accuracy"]),
        host_params=int(info["host_params"]),
        params_added=kept,
        germinated=int(info["count/germinated"]),
        fossilized=int(info["count/fossilized"]),
        pruned=int(info["count/pruned"]),
        rollbacks=int(info["count/rollbacks"]),
        refused=int(info["count/refused"]),
        train_flops=int(info["flops/train"]),
        seed_train_flops=int(info["flops/train_seeds"]),
        validation_flops=int(info["flops/validation"]),
        counterfactual_flops=int(info["flops/counterfactual"]),
        rolled_back=bool(info["rollback"]),
        seconds=time.perf_counter() - start,
        test_accuracy=test.accuracy if test else None,
        test_loss=test.loss if test else None,
        final_accuracy_with_probation=float(info["val_accuracy"]),
        params_on_probation=int(info["seed_params"]) - kept,
        test_accuracy_with_probation=test.accuracy_with_probation if test else None,
        family_member=info.get("family_member"),
        torch_threads=torch.get_num_threads(),
        reset_seed=reset_seed,
    )


def run_episodes(
    env: MorphogeneticEnv,
    controller: Controller,
    episodes: int,
    progress: bool,
    measure_test: bool = False,
    on_episode_end: EpisodeEnd | None = None,
    label: str = "episodes",
) -> list[EpisodeSummary]:
    """`episodes` episodes in a row; with `progress`, lines on stderr that begin with `label`, one per episode and
    one per slow epoch, each with the time left (progress_lines.py). `on_episode_end` sees each one's env,
    summary and history before the next episode resets the env."""
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: must be >= 1")
    if progress:
        warn(label, env.base_cfg.short_run_warning())
    lines = EpisodeProgress(label, episodes, env.cfg.max_epochs, threads=torch.get_num_threads()) if progress else None
    summaries: list[EpisodeSummary] = []
    for episode in range(episodes):
        history = EpisodeHistory()
        summaries.append(
            run_episode(
                env,
                controller,
                episode,
                on_step=lines.epoch if lines else None,
                measure_test=measure_test,
                history=history,
            )
        )
        if on_episode_end is not None:
            on_episode_end(env, summaries[-1], history)
        if lines is not None:
            s = summaries[-1]
            lines.episode_end(s.final_accuracy, s.params_added, s.seconds, s.test_accuracy)
    return summaries


def format_summary(s: EpisodeSummary) -> str:
    test = f", test acc {100 * s.test_accuracy:.2f}%" if s.test_accuracy is not None else ""
    probation = ""
    if s.params_on_probation:
        with_probation = (
            s.test_accuracy_with_probation
            if s.test_accuracy_with_probation is not None
            else s.final_accuracy_with_probation
        )
        probation = (
            f" ({s.params_on_probation:,} params still on probation dropped; with them "
            f"{100 * (with_probation or 0.0):.2f}%)"
        )
    return (
        f"episode {s.episode}{f' ({s.family_member})' if s.family_member else ''}: "
        f"final acc {100 * s.final_accuracy:.2f}% (start {100 * s.initial_accuracy:.2f}%){test}, "
        f"params kept {s.params_added:,} on a {s.host_params:,}-param host{probation}, "
        f"seeds germinated {s.germinated} / "
        f"fossilized {s.fossilized} / pruned {s.pruned}, return {s.episode_return:.2f}, "
        f"training {s.train_flops:.3g} FLOPs, "
        f"{s.seconds:.1f}s" + (", ended by governor rollback" if s.rolled_back else "")
    )
