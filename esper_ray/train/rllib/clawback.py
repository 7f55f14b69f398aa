"""The original's rollback clawback (DOMAIN.md section 11): when the governor rolls a host back, the episode
ends with the -10 penalty and every earlier reward of that episode is forfeited to 0, so that no reward
earned on the way to a divergence survives it.

A learner connector piece, first in the pipeline, on the episodes as they arrive: the env has returned those
rewards long before it knew of the rollback. The env runners' metrics keep the rewards as paid. Only the
part of the episode in this round's batch can be forfeited: a chunk sampled in an earlier round has been
learned from already.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.utils.annotations import override


def rolled_back(episode: Any) -> bool:
    return bool(episode.is_terminated and len(episode) > 0 and episode.get_infos(-1).get("rollback"))


# RLlib's AddOneTsToEpisodesAndTruncate (first in PPO's pipeline) appends a bootstrap step to every episode and
# says so in shared_data under this key.
BOOTSTRAP_STEP_ADDED = "_added_loss_mask_for_valid_episode_ts"
FORFEITED = np.zeros((), dtype=np.float32)
"""A forfeited reward, as a 0-d array: RLlib checks each reward it sets against its reward space (a Box of shape
()), and an element of a 1-d array there is a numpy scalar, which gymnasium's Box.contains casts with a warning
("Casting input x to numpy array"); set index by index, each reward is an array of the space's shape."""


class RollbackClawback(ConnectorV2):
    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: Any,
        explore: Any = None,
        shared_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        extra = 1 if (shared_data or {}).get(BOOTSTRAP_STEP_ADDED) else 0
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            steps = len(episode) - extra  # the real steps; the last one carries the rollback penalty
            if rolled_back(episode) and steps > 1:
                episode.set_rewards(new_data=[FORFEITED] * (steps - 1), at_indices=list(range(steps - 1)))
        return batch


def clawback_connector(input_observation_space: Any = None, input_action_space: Any = None) -> RollbackClawback:
    """What AlgorithmConfig.learners(learner_connector=...) calls to build the piece."""
    return RollbackClawback()
