"""One A/B trial as a Tune Trainable: builds the trial's PPO algorithm and trains it round by round.

Tune reserves the trial's resources as RLlib would for PPO itself (a placement group of the driver, env
runner and learner bundles, PACK or SPREAD), and the algorithm's actors are placed inside it.
"""

from __future__ import annotations

import math
from typing import Any

from ray import tune
from ray.rllib.algorithms.ppo import PPO
from ray.tune.execution.placement_groups import PlacementGroupFactory

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.ppo_config import build_ppo_config
from esper_ray.train.round_summary import flatten_numbers, summarize_round

TRIAL_KEY = "trial"
SUMMARY_PREFIX = "round/"


def train_config_of(config: dict[str, Any]) -> TrainConfig:
    return TrainConfig.from_mapping(config[TRIAL_KEY]["train"])


class MorphoTrial(tune.Trainable):
    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> PlacementGroupFactory:
        return PPO.default_resource_request(build_ppo_config(train_config_of(config)))

    def setup(self, config: dict[str, Any]) -> None:
        self.algo = build_ppo_config(train_config_of(config)).build_algo()

    def step(self) -> dict[str, Any]:
        result = self.algo.train()
        summary = summarize_round(result)
        metrics = {k: v for k, v in flatten_numbers(result).items() if math.isfinite(v)}
        metrics.update({SUMMARY_PREFIX + k: v for k, v in summary.as_dict().items()})
        return metrics

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.algo.save_to_path(checkpoint_dir)

    def load_checkpoint(self, checkpoint: str) -> None:  # type: ignore[override]
        self.algo.restore_from_path(checkpoint)

    def cleanup(self) -> None:
        self.algo.stop()
