"""The one place observations are normalised: a running mean/std filter over `obs["features"]`.

It is RLlib's MeanStdFilter connector (running statistics, clipping, state merged across env runners every
round and saved in checkpoints) restricted to the Box `features`: in Ray 2.60 the stock connector fails on a
Dict observation that also holds discrete parts. Like the stock connector, it writes the normalised
observation back into the episode, so the learner trains on exactly the input the policy acted on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter
from ray.rllib.utils.annotations import override
from ray.rllib.utils.filter import MeanStdFilter as RunningMeanStd

FEATURES = "features"


class FeatureMeanStdFilter(MeanStdFilter):
    @override(MeanStdFilter)
    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any], explore: Any = None,
                 persistent_data: Any = None, **kwargs: Any) -> Any:
        for episode in self.single_agent_episode_iterator(episodes):
            obs = dict(episode.get_observations(indices=-1))
            obs[FEATURES] = self.normalize(obs[FEATURES], update=self._update_stats)
            episode.set_observations(at_indices=-1, new_data=obs)
            episode.observation_space = self.observation_space
        return batch

    def normalize(self, features: np.ndarray, update: bool) -> np.ndarray:
        """(features - running mean) / running std, clipped; `update` adds them to the statistics first."""
        if self._filters is None:
            self._init_new_filters()
        return self._filters[None](features, update=update)

    @override(MeanStdFilter)
    def _init_new_filters(self) -> None:
        shape = np.array(self.input_observation_space[FEATURES].shape)  # type: ignore[index]
        self._filters = {
            None: RunningMeanStd(shape, demean=self.de_mean_to_zero, destd=self.de_std_to_one, clip=self.clip_by_value)
        }
