"""The one place observations are normalised: a running mean/std filter over `obs["features"]`.

It is RLlib's MeanStdFilter connector (running statistics, clipping, state merged across env runners every
round and saved in checkpoints) restricted to the Box `features`: in Ray 2.60 the stock connector fails on a
Dict observation that also holds discrete parts. Like the stock connector, it writes the normalised
observation back into the episode, so the learner trains on exactly the input the policy acted on.

It also mends how the stock connector merges the env runners' statistics (Ray 2.60). Every round RLlib gathers each
runner's state, merges them into the driver's and sends the result back. The stock merge adds what each
runner's `RunningStat` counts as new since the last merge (`num_pushes_delta`, `mean_delta_array`), and that
bookkeeping is right only for a statistic that started empty: once a runner has been sent the merged statistics,
its "new mean" grows by (x - running mean) / all pushes, not by (x - new mean) / new pushes, so from the second
round on the merged mean decays towards 0 and the std grows (data of mean 5 and std 1 over 2 runners: merged mean
2.5 after round 2, 0.9 after round 8; std 2.8, then 3.4; measurements/filter_merge.py). Here each runner reports
the features it pushed since it was last sent the merged statistics (`new_since_sync`: the filter's own `buffer`,
which RLlib pushes beside the running statistics, emptied at every set_state, so RLlib's own update of it is
exact) and the merge adds those alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter
from ray.rllib.utils.annotations import override
from ray.rllib.utils.filter import MeanStdFilter as RunningMeanStd
from ray.rllib.utils.filter import RunningStat
from ray.rllib.utils.typing import StateDict

FEATURES = "features"
NEW_SINCE_SYNC = "new_since_sync"
"""The state's key for the features a runner pushed since it was last sent the merged statistics."""


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
    def get_state(self, *args: Any, **kwargs: Any) -> StateDict:
        state = super().get_state(*args, **kwargs)
        state[None][NEW_SINCE_SYNC] = self._filters[None].buffer.to_state()
        return state

    @override(MeanStdFilter)
    def set_state(self, state: StateDict) -> None:
        super().set_state(state)
        self.start_next_report()

    def start_next_report(self) -> None:
        """Count what it pushes from here on as new for the next merge (what it pushed so far has been reported)."""
        if self._filters is not None:
            self._filters[None].reset_buffer()

    @override(MeanStdFilter)
    def merge_states(self, states: list[StateDict]) -> StateDict:
        """The merged statistics (this filter's) plus what each runner pushed since it was last sent them."""
        if self._filters is None:
            self._init_new_filters()
        merged = self._filters[None].running_stats
        for state in states:
            merged.update(RunningStat.from_state(state[None][NEW_SINCE_SYNC]))
        return self.get_state()

    @override(MeanStdFilter)
    def _init_new_filters(self) -> None:
        shape = np.array(self.input_observation_space[FEATURES].shape)  # type: ignore[index]
        self._filters = {
            None: RunningMeanStd(shape, demean=self.de_mean_to_zero, destd=self.de_std_to_one, clip=self.clip_by_value)
        }


def feature_filter_of(pipeline: Any, where: str) -> FeatureMeanStdFilter:
    """The one FeatureMeanStdFilter of an env-to-module connector pipeline; `where` names the pipeline in the error."""
    filters = [c for c in pipeline.connectors if isinstance(c, FeatureMeanStdFilter)]
    if len(filters) != 1:
        raise ValueError(f"{where}: expected one FeatureMeanStdFilter in the env-to-module pipeline, found {len(filters)}")
    return filters[0]
