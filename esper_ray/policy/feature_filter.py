"""The one place observations are normalised: a running mean/std filter over `obs["features"]`.

Slot features are pooled over slot positions (issue 68): one running mean/std per slot feature, shared by every
position and fed only by the positions a host has, so a position no training host had is normalised with the same
feature's statistics elsewhere (per position, a padded column has zero variance in training and would explode by
1e8 on a host that fills it). A slot's descriptors (present, depth, width, topology) pass through as they are: they
are bounded and fixed for a host, so per-host statistics would turn them into a constant 0 in training and into the
clip bound on another host. An absent position comes out all zero. Base features keep their own statistics.

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

from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter
from ray.rllib.utils.annotations import override
from ray.rllib.utils.filter import MeanStdFilter as RunningMeanStd
from ray.rllib.utils.filter import RunningStat
from ray.rllib.utils.typing import StateDict

from esper_ray.contracts.actions import MAX_SLOTS
from esper_ray.env.observation import BASE_FEATURES, SLOT_BLOCK, SLOT_FEATURES, SLOT_PRESENT

FEATURES = "features"
NEW_SINCE_SYNC = "new_since_sync"
"""The state's key for the features a runner pushed since it was last sent the merged statistics."""
SLOTS = "slots"
"""The state's key (beside RLlib's agent key None, the base features) of the pooled slot statistics."""


@dataclass(frozen=True)
class FeatureLayout:
    """Where the features are: `base` columns, then `slots` blocks of `block` columns, each its `measured` features
    first and its present flag at `present` (the rest descriptors, left as they are)."""

    base: int = BASE_FEATURES
    slots: int = MAX_SLOTS
    block: int = SLOT_BLOCK
    measured: int = SLOT_FEATURES
    present: int = SLOT_PRESENT

    @property
    def size(self) -> int:
        return self.base + self.slots * self.block


class FeatureMeanStdFilter(MeanStdFilter):
    def __init__(self, *args: Any, layout: FeatureLayout | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout = layout or FeatureLayout()

    @override(MeanStdFilter)
    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: list[Any],
        explore: Any = None,
        persistent_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        for episode in self.single_agent_episode_iterator(episodes):
            obs = dict(episode.get_observations(indices=-1))
            obs[FEATURES] = self.normalize(obs[FEATURES], update=self._update_stats)
            episode.set_observations(at_indices=-1, new_data=obs)
            episode.observation_space = self.observation_space
        return batch

    def normalize(self, features: np.ndarray, update: bool) -> np.ndarray:
        """(features - running mean) / running std, clipped; `update` adds them to the statistics first. Slot blocks:
        the measured part of each present one by the pooled statistics, descriptors as they are, absent ones zero."""
        if self._filters is None:
            self._init_new_filters()
        lay = self.layout
        x = np.asarray(features)
        if x.shape != (lay.size,):
            raise ValueError(f"observation features of shape {x.shape}; the filter's layout has ({lay.size},)")
        out = np.zeros_like(x)
        out[: lay.base] = self._filters[None](x[: lay.base], update=update)
        blocks = x[lay.base :].reshape(lay.slots, lay.block)
        present = blocks[:, lay.present] > 0.5
        pooled = self._filters[SLOTS]
        if update:
            for measured in blocks[present, : lay.measured]:
                pooled.running_stats.push(measured)
                pooled.buffer.push(measured)
        shaped = out[lay.base :].reshape(lay.slots, lay.block)
        shaped[present] = blocks[present]
        if present.any():
            shaped[present, : lay.measured] = pooled(blocks[present, : lay.measured], update=False)
        return out

    @override(MeanStdFilter)
    def get_state(self, *args: Any, **kwargs: Any) -> StateDict:
        state = super().get_state(*args, **kwargs)
        for key, running in self._filters.items():
            state[key][NEW_SINCE_SYNC] = running.buffer.to_state()
        return state

    @override(MeanStdFilter)
    def set_state(self, state: StateDict) -> None:
        if set(state) != {None, SLOTS}:
            raise ValueError(
                f"observation filter state has parts {sorted(map(str, state))}; expected the base features "
                f"and pooled slot statistics (a filter saved before issue 68 cannot be loaded)"
            )
        super().set_state(state)
        self.start_next_report()

    def start_next_report(self) -> None:
        """Count what it pushes from here on as new for the next merge (what it pushed so far has been reported)."""
        if self._filters is not None:
            for running in self._filters.values():
                running.reset_buffer()

    @override(MeanStdFilter)
    def merge_states(self, states: list[StateDict]) -> StateDict:
        """The merged statistics (this filter's) plus what each runner pushed since it was last sent them."""
        if self._filters is None:
            self._init_new_filters()
        for key, running in self._filters.items():
            for state in states:
                running.running_stats.update(RunningStat.from_state(state[key][NEW_SINCE_SYNC]))
        return self.get_state()

    @override(MeanStdFilter)
    def _init_new_filters(self) -> None:
        size = int(np.prod(self.input_observation_space[FEATURES].shape))  # type: ignore[index]
        if size != self.layout.size:
            raise ValueError(f"observation features of size {size}; the filter's layout has {self.layout.size}")

        def running(n: int) -> RunningMeanStd:
            return RunningMeanStd(
                np.array([n]), demean=self.de_mean_to_zero, destd=self.de_std_to_one, clip=self.clip_by_value
            )

        self._filters = {None: running(self.layout.base), SLOTS: running(self.layout.measured)}


def feature_filter_of(pipeline: Any, where: str) -> FeatureMeanStdFilter:
    """The one FeatureMeanStdFilter of an env-to-module connector pipeline; `where` names the pipeline in the error."""
    filters = [c for c in pipeline.connectors if isinstance(c, FeatureMeanStdFilter)]
    if len(filters) != 1:
        raise ValueError(
            f"{where}: expected one FeatureMeanStdFilter in the env-to-module pipeline, found {len(filters)}"
        )
    return filters[0]
