"""`esper-ray eval`: run a checkpoint's greedy policy on fresh episodes, summarised as `esper-ray heuristic` does.

The policy sees observations normalised with the checkpoint's own filter statistics (frozen), through the
same filter class used in training, so evaluation feeds the network what training fed it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModule

from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.policy.feature_filter import FEATURES, FeatureMeanStdFilter
from esper_ray.train.episodes import EpisodeSummary, run_episodes
from esper_ray.train.runner import load_checkpoint_config

MODULE_PATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"
ENV_TO_MODULE_PATH = Path("env_runner") / "env_to_module_connector"


class GreedyPolicyController:
    """Most likely action of every head, with the LSTM state carried through the episode."""

    def __init__(self, module: RLModule, feature_filter: FeatureMeanStdFilter) -> None:
        self.module = module
        self.filter = feature_filter
        self.reset()

    def reset(self) -> None:
        self.state = {k: torch.as_tensor(v)[None] for k, v in self.module.get_initial_state().items()}

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        normalized = self.filter.normalize(obs[FEATURES], update=False)  # frozen training statistics
        batch = {
            Columns.OBS: {
                FEATURES: torch.as_tensor(normalized, dtype=torch.float32)[None, None],
                "blueprint_ids": torch.as_tensor(obs["blueprint_ids"])[None, None],
                "action_mask": torch.as_tensor(obs["action_mask"])[None, None],
            },
            Columns.STATE_IN: self.state,
        }
        with torch.no_grad():
            out = self.module.forward_inference(batch)
        self.state = out[Columns.STATE_OUT]
        dist = self.module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        return dist.to_deterministic().sample()[0, 0].numpy()


def load_policy(checkpoint: Path) -> tuple[RLModule, FeatureMeanStdFilter]:
    module = RLModule.from_checkpoint(str((checkpoint / MODULE_PATH).resolve()))
    module.eval()
    pipeline = ConnectorPipelineV2.from_checkpoint(str((checkpoint / ENV_TO_MODULE_PATH).resolve()))
    filters = [c for c in pipeline.connectors if isinstance(c, FeatureMeanStdFilter)]
    if len(filters) != 1:
        raise ValueError(f"checkpoint {checkpoint}: expected one FeatureMeanStdFilter in the env-to-module pipeline, found {len(filters)}")
    return module, filters[0]


def run_evaluation(checkpoint: Path, episodes: int, seed: int | None = None, env_overrides: Mapping[str, Any] | None = None,
                   progress: bool = True) -> list[EpisodeSummary]:
    cfg = load_checkpoint_config(checkpoint)
    env_config = {**cfg.env_config(shard=0, num_shards=1), **(env_overrides or {})}
    if seed is not None:
        env_config["seed"] = seed
    env = MorphogeneticEnv(env_config)
    module, feature_filter = load_policy(checkpoint)
    return run_episodes(env, GreedyPolicyController(module, feature_filter), episodes, progress)
