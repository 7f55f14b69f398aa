"""Build RLlib's PPOConfig (new API stack) from a TrainConfig.

Choices and where they differ from the original's PPO defaults (DOMAIN.md section 10), and why:
- `envs` envs as `env_runners` runners of `envs_per_runner` each (resolved before: TrainConfig.resolved; more than
  one as one vector env whose CPU hosts train stacked: env/vector_env.py); each env collects `episodes_per_env`
  complete episodes per round, so a round's batch is whole episodes and every round reports finished episodes.
- LSTM sequences are whole episodes: `max_seq_len = max_epochs + 1`, because RLlib's learner appends one
  bootstrap timestep (for V(s_T)) to every episode; one chunk per episode, no truncated BPTT.
- `ppo_epochs` (default 16) full-batch passes (see train/rllib/learner.py). The original did 1 pass; with
  RLlib's stored-state sequences several passes are safe, and they learn faster from expensive episodes.
- `overlap`: the learner trains on one round while the env runners sample the next (train/rllib/overlap.py).
- No KL penalty (`use_kl_loss=False`), as in the original; an approximate KL is still logged.
- No value-loss clipping (`vf_clip_param=inf`): RLlib clips the squared error at 10 by default, which
  silently zeroes the value gradient for returns of this scale.
- The original's per-head ratio clipping, probability floors and EMA value normaliser are not reproduced:
  RLlib's joint-ratio PPO with advantage standardisation per batch is used as it is.
- Observations are normalised once, by a MeanStdFilter connector on the env runners (policy/feature_filter.py),
  which writes the normalised observation back into the episode: the learner trains on exactly what the
  policy saw. Its running statistics are merged across env runners every round and saved in checkpoints.
- The network is MorphoPolicyModule, or SlotPolicyModule with `policy: slots` (new and untrained: issue 75).
"""

from __future__ import annotations

import math

from ray.rllib.algorithms.ppo import PPO, PPOConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from esper_ray.contracts.train_config import SLOT_ARCHITECTURES, TrainConfig
from esper_ray.policy.feature_filter import FeatureMeanStdFilter
from esper_ray.policy.layout import LAYOUT_KEY, policy_layout
from esper_ray.policy.rl_module import MODEL_PRESETS, MorphoPolicyModule
from esper_ray.policy.slot_module import SLOT_MODEL_PRESETS, SlotPolicyModule
from esper_ray.train.output.progress import PROGRESS_ACTOR_KEY
from esper_ray.train.rllib.callbacks import MorphoMetrics
from esper_ray.train.rllib.clawback import clawback_connector
from esper_ray.train.rllib.env_factory import ShardedMorphogeneticEnv, ShardedVectorMorphogeneticEnv
from esper_ray.train.rllib.env_runner import CpuPolicyEnvRunner
from esper_ray.train.rllib.learner import BLUEPRINT_ENTROPY_KEY, MorphoPPOLearner
from esper_ray.train.rllib.overlap import OverlappedPPO


def observation_filter(env: object, spaces: object, device: object) -> FeatureMeanStdFilter:
    """Normalise the observation's features; the mask and blueprint ids pass through untouched."""
    return FeatureMeanStdFilter(clip_by_value=10.0)


def build_ppo_config(cfg: TrainConfig, progress_actor: str | None = None) -> PPOConfig:
    """`progress_actor`: name of a StepCounter the env runners report their steps to (train/output/progress.py)."""
    steps_per_runner = cfg.episode_steps_per_env
    per_runner = cfg.runner_envs
    batch_per_learner = math.ceil(cfg.episode_steps_per_round / max(cfg.learners, 1))
    slots = cfg.policy in SLOT_ARCHITECTURES
    module_class, presets = (SlotPolicyModule, SLOT_MODEL_PRESETS) if slots else (MorphoPolicyModule, MODEL_PRESETS)
    model_config = dict(
        presets[cfg.model],
        max_seq_len=cfg.longest_episode + 1,
        prune_logit=cfg.prune_logit,
        fossilize_logit=cfg.fossilize_logit,
        **{LAYOUT_KEY: policy_layout(cfg.policy)},
    )
    return (
        PPOConfig(algo_class=OverlappedPPO if cfg.overlap else PPO)
        .environment(
            ShardedMorphogeneticEnv if per_runner == 1 else ShardedVectorMorphogeneticEnv,
            env_config=cfg.env_config(),
        )
        .env_runners(
            num_env_runners=cfg.env_runners,
            num_envs_per_env_runner=per_runner,
            # more than one: RLlib calls ShardedVectorMorphogeneticEnv for the runner's whole vector env
            gym_env_vectorize_mode="sync" if per_runner == 1 else "vector_entry_point",
            num_cpus_per_env_runner=cfg.cpus_per_env,
            num_gpus_per_env_runner=cfg.gpus_per_env,
            rollout_fragment_length=steps_per_runner,
            batch_mode="truncate_episodes",
            sample_timeout_s=None,  # an env step is a whole host epoch: never give up on a slow runner
            env_to_module_connector=observation_filter,
            env_runner_cls=CpuPolicyEnvRunner,  # the env uses the runner's GPU share, the policy the CPU
        )
        .learners(
            num_learners=cfg.learners,
            num_gpus_per_learner=cfg.learner_gpus,
            num_cpus_per_learner=cfg.effective_learner_cpus,
            learner_class=MorphoPPOLearner,
            learner_config_dict={
                "reward_normalization": cfg.reward_normalization,
                PROGRESS_ACTOR_KEY: progress_actor,
                BLUEPRINT_ENTROPY_KEY: cfg.blueprint_entropy_coeff,
            },
            learner_connector=clawback_connector if cfg.rollback_clawback else None,
        )
        .training(
            lr=cfg.lr,
            gamma=cfg.gamma,
            lambda_=cfg.gae_lambda,
            clip_param=cfg.clip_param,
            entropy_coeff=cfg.entropy_coeff,
            vf_loss_coeff=cfg.vf_loss_coeff,
            vf_clip_param=float("inf"),
            use_kl_loss=False,
            grad_clip=cfg.grad_clip,
            num_epochs=cfg.ppo_epochs,
            train_batch_size_per_learner=batch_per_learner,
            # MorphoPPOLearner steps on its whole batch `ppo_epochs` times; RLlib still needs a size to shard
            # episodes over several learners.
            minibatch_size=batch_per_learner,
        )
        .rl_module(rl_module_spec=RLModuleSpec(module_class=module_class, model_config=model_config))
        .resources(num_cpus_for_main_process=cfg.driver_cpus, placement_strategy=cfg.placement)
        .callbacks(MorphoMetrics)
        .fault_tolerance(restart_failed_sub_environments=True, delay_between_env_runner_restarts_s=5.0)
        .debugging(seed=cfg.seed)
    )
