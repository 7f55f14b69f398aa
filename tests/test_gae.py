"""GAE in RLlib's learner connector pipeline against a hand-worked GAE (seed doc 004), and the reward normaliser.

A rollout fragment cut mid-episode (truncated) must bootstrap with V(s_T); the end of a host run and a governor
rollback (terminated) with 0.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env import MorphogeneticEnv
from esper_ray.policy.heuristic import HeuristicController
from esper_ray.train.rllib.ppo_config import build_ppo_config

T = 5
GAMMA, LAMBDA = 0.9, 0.8
REWARDS = [0.5, -1.0, 2.0, 0.25, 1.5]


def record_episode(env: MorphogeneticEnv, *, terminated: bool, rollback: bool = False) -> SingleAgentEpisode:
    obs, info = env.reset(seed=0)
    controller = HeuristicController(env.slot_ids, T)
    observations, actions, infos = [obs], [], [info]
    for _ in range(T):
        action = controller.act(obs)
        obs, _, _, _, info = env.step(action)
        observations.append(obs)
        actions.append(action)
        infos.append(dict(info, rollback="nan" if rollback else ""))
    cell = 64
    extra = {
        Columns.ACTION_LOGP: np.zeros(T, np.float32),
        Columns.ACTION_DIST_INPUTS: np.zeros((T, int(sum(env.action_space.nvec))), np.float32),
        Columns.STATE_OUT: {"h": np.zeros((T, cell), np.float32), "c": np.zeros((T, cell), np.float32)},
    }
    episode = SingleAgentEpisode(
        observations=observations,
        actions=actions,
        rewards=REWARDS,
        infos=infos,
        extra_model_outputs=extra,
        terminated=terminated,
        truncated=not terminated,
        observation_space=env.observation_space,
        action_space=env.action_space,
        len_lookback_buffer=0,
    )
    return episode.to_numpy()


def hand_gae(values: list[float], *, bootstrap: bool, rewards: list[float] = REWARDS) -> list[float]:
    """Value targets by the textbook recursion; values has T + 1 entries (the last is V(s_T))."""
    targets, gae = [0.0] * T, 0.0
    for t in reversed(range(T)):
        next_value = values[t + 1] if (t < T - 1 or bootstrap) else 0.0
        delta = rewards[t] + GAMMA * next_value - values[t]
        gae = delta + GAMMA * LAMBDA * gae
        targets[t] = gae + values[t]
    return targets


def value_targets(normalize: bool, clawback: bool = False, rollback: bool = False):
    cfg = TrainConfig(
        max_epochs=T,
        envs=1,
        learners=0,
        gamma=GAMMA,
        gae_lambda=LAMBDA,
        reward_normalization=normalize,
        rollback_clawback=clawback,
    )
    env = MorphogeneticEnv(cfg.env_config(shard=0, num_shards=6))
    spaces = {
        "__env__": (env.observation_space, env.action_space),
        "default_policy": (env.observation_space, env.action_space),
    }
    learner = build_ppo_config(cfg).build_learner(spaces=spaces)  # PPOLearner.build() adds AddOneTs... and GAE
    episodes = [record_episode(env, terminated=False), record_episode(env, terminated=True, rollback=rollback)]
    observations = [e.get_observations() for e in episodes]  # before the connector appends its phantom step
    batch = learner._learner_connector(
        rl_module=learner.module, batch={}, episodes=episodes, shared_data={}, metrics=learner.metrics
    )
    return learner, batch, observations


def test_learner_connector_bootstraps_truncation_with_v_of_s_t_and_termination_with_zero():
    learner, batch, observations = value_targets(normalize=False)
    targets = batch["default_policy"][Postprocessing.VALUE_TARGETS]
    assert batch["default_policy"][Columns.SEQ_LENS].tolist() == [T + 1, T + 1]  # one chunk per episode

    module = learner.module["default_policy"]
    for row, (obs, bootstrap) in enumerate(zip(observations, (True, False))):
        sequence = {k: torch.as_tensor(v)[None] for k, v in obs.items()}  # [1, T + 1, ...]
        state = {k: torch.as_tensor(v)[None] for k, v in module.get_initial_state().items()}
        with torch.no_grad():
            values = module.compute_values({Columns.OBS: sequence, Columns.STATE_IN: state})[0].tolist()
        expected = hand_gae(values, bootstrap=bootstrap)
        assert targets[row, :T].tolist() == pytest.approx(expected, abs=1e-5)
    # the two episodes share states and rewards; only the last step's bootstrap differs: gamma * V(s_T)
    assert float(targets[0, T - 1] - targets[1, T - 1]) == pytest.approx(GAMMA * values[T], abs=1e-5)
    assert abs(values[T]) > 1e-3


def test_reward_normaliser_divides_by_the_running_std_before_gae_and_keeps_its_state():
    learner, batch, observations = value_targets(normalize=True)
    std = float(np.std(REWARDS * 2))  # the 10 real rewards of the batch (padding and bootstrap steps excluded)
    scaled = [r / std for r in REWARDS]
    assert batch["default_policy"][Columns.REWARDS][0, :T].tolist() == pytest.approx(scaled, rel=1e-5)
    module = learner.module["default_policy"]
    sequence = {k: torch.as_tensor(v)[None] for k, v in observations[1].items()}
    state = {k: torch.as_tensor(v)[None] for k, v in module.get_initial_state().items()}
    with torch.no_grad():
        values = module.compute_values({Columns.OBS: sequence, Columns.STATE_IN: state})[0].tolist()
    targets = batch["default_policy"][Postprocessing.VALUE_TARGETS]
    assert targets[1, :T].tolist() == pytest.approx(hand_gae(values, bootstrap=False, rewards=scaled), abs=1e-5)
    saved = learner.get_state()["reward_normalizer"]
    assert saved["count"] == 10 and saved["mean"] == pytest.approx(np.mean(REWARDS))


def test_forfeiting_rewards_sets_each_as_an_array_of_the_reward_space_s_shape():
    """RLlib checks every reward it sets against its Box of shape (); a numpy scalar there made gymnasium warn
    "Casting input x to numpy array" (in ANSI colours) in every rollback."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, batch, _ = value_targets(normalize=False, clawback=True, rollback=True)
    assert [str(w.message) for w in caught if "Casting" in str(w.message)] == []
    assert batch["default_policy"][Columns.REWARDS][1, : T - 1].tolist() == [0.0] * (T - 1)


def test_running_std_merges_batches_like_one_pass():
    from esper_ray.train.rllib.reward_normalizer import RunningStd

    rng = np.random.default_rng(0)
    parts = [rng.normal(3, 2, n) for n in (1, 0, 7, 40, 3)]
    running = RunningStd()
    assert running.std == 1.0  # nothing seen yet: rewards pass unscaled
    running.update(parts[0])
    assert running.std == 1.0 and running.count == 1
    for part in parts[1:3]:
        running.update(part)
    resumed = RunningStd()  # from a checkpoint: the state is all it needs
    resumed.set_state(running.get_state())
    for part in parts[3:]:
        running.update(part)
        resumed.update(part)
    assert running.std == pytest.approx(np.std(np.concatenate(parts)), rel=1e-12) and running.count == 51
    assert resumed.get_state() == running.get_state()


def test_a_rollback_forfeits_the_episodes_earlier_rewards_and_keeps_its_penalty():
    _, batch, _ = value_targets(normalize=False, clawback=True, rollback=True)
    rewards = batch["default_policy"][Columns.REWARDS]
    assert rewards[0, :T].tolist() == pytest.approx(REWARDS)  # the cut episode keeps its rewards
    assert rewards[1, :T].tolist() == pytest.approx(
        [0.0] * (T - 1) + [REWARDS[-1]]
    )  # the rolled-back one: only its last
    _, untouched, _ = value_targets(normalize=False, clawback=True, rollback=False)
    assert untouched["default_policy"][Columns.REWARDS][1, :T].tolist() == pytest.approx(REWARDS)
