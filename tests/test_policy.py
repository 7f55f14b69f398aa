"""The factored action distribution and the policy module, checked against independent computations."""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from esper_ray.contracts.actions import HEAD_NAMES, Blueprint, Op, decode_joint, encode_joint
from esper_ray.contracts.stages import Stage
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.masks import action_nvec
from esper_ray.policy.baselines import lifecycle_action
from esper_ray.policy.distribution import CausalFactoredDistribution, relevance_matrix
from esper_ray.policy.rl_module import MODEL_PRESETS, MorphoPolicyModule
from esper_ray.train.rllib.learner import BLUEPRINT_ENTROPY_KEY, blueprint_entropy_bonus
from esper_ray.train.rllib.ppo_config import build_ppo_config
from tests.morpho_helpers import drive_to

NUM_SLOTS = 2
NVEC = action_nvec()


def make_dist(seed: int, scale: float = 1.0, batch: int | None = None) -> CausalFactoredDistribution:
    logits = scale * torch.randn(sum(NVEC), generator=torch.Generator().manual_seed(seed))
    if batch is not None:
        logits = logits.expand(batch, -1)
    return CausalFactoredDistribution.from_logits(logits, input_lens=NVEC, relevance=relevance_matrix())


def test_heads_the_op_ignores_do_not_change_the_log_probability():
    dist = make_dist(0)
    prune = torch.tensor([encode_joint(Op.PRUNE, 1), 3, 1, 0, 2, 1, 4])
    other_blueprint = prune.clone()
    other_blueprint[1] = 5  # blueprint does not matter for PRUNE
    other_speed = prune.clone()
    other_speed[5] = 2  # alpha_speed does
    assert torch.equal(dist.logp(prune), dist.logp(other_blueprint))
    assert not torch.equal(dist.logp(prune), dist.logp(other_speed))
    germinate = torch.tensor([encode_joint(Op.GERMINATE, 0), 3, 1, 0, 2, 1, 4])
    germinate_other = germinate.clone()
    germinate_other[1] = 5
    assert not torch.equal(dist.logp(germinate), dist.logp(germinate_other))
    wait = torch.tensor([0, 3, 1, 0, 2, 1, 4])
    assert torch.allclose(dist.logp(wait), torch.log_softmax(dist.heads[0].logits, -1)[0])


def test_entropy_and_kl_match_monte_carlo_estimates_over_executed_actions():
    n = 200_000
    p, q = make_dist(1, scale=1.5, batch=n), make_dist(2, scale=1.5, batch=n)
    torch.manual_seed(0)
    samples = p.sample()  # [n, heads]
    logp_p, logp_q = p.logp(samples), q.logp(samples)
    assert float(-logp_p.mean()) == pytest.approx(float(p.entropy()[0]), abs=0.02)
    assert float((logp_p - logp_q).mean()) == pytest.approx(float(p.kl(q)[0]), abs=0.02)


def test_sampling_draws_each_head_from_its_softmax_and_logp_is_the_read_heads_categorical_log_probability():
    n = 200_000
    dist = make_dist(5, scale=1.5, batch=n)
    torch.manual_seed(1)
    samples = dist.sample()
    parts = [head.logits[0] for head in dist.heads]  # one row: every row of the batch has the same logits
    # Each head's frequencies against its own softmax, within 5 standard errors: over the 43 values a correct sampler
    # fails that with probability ~3e-5 whatever the RNG stream (3 failed on 2 of 6 seeds); a wrong one is far off.
    for h, part in enumerate(parts):
        frequency = torch.bincount(samples[:, h], minlength=NVEC[h]).double() / n
        probs = torch.softmax(part.double(), -1)
        assert torch.all((frequency - probs).abs() <= 5 * (probs * (1 - probs) / n).sqrt() + 1e-4), h
    relevance = torch.tensor(relevance_matrix(), dtype=torch.float64)
    expected = []
    for action in samples[:50]:  # torch.distributions.Categorical per head, summed over the heads the op reads
        logps = [torch.distributions.Categorical(logits=part.double()).log_prob(a) for part, a in zip(parts, action)]
        expected.append(logps[0] + sum(relevance[action[0], h - 1] * logps[h] for h in range(1, len(parts))))
    assert torch.allclose(dist.logp(samples)[:50].double(), torch.stack(expected), atol=1e-5)


def test_per_head_entropies_sum_to_the_entropy_and_weight_argument_heads_by_use():
    dist = make_dist(3)
    parts = dist.head_entropies()
    assert float(sum(parts.values())) == pytest.approx(float(dist.entropy()))
    read = dist.read_probability()
    probs = torch.softmax(dist.heads[0].logits, -1)
    germinate_prob = sum(float(probs[j]) for j in range(NVEC[0]) if decode_joint(j)[0] is Op.GERMINATE)
    assert float(read[0]) == pytest.approx(germinate_prob)  # blueprint is read only by GERMINATE


def test_the_blueprint_bonus_is_the_blueprint_heads_read_weighted_entropy_and_moves_only_that_head():
    logits = torch.randn(sum(NVEC), generator=torch.Generator().manual_seed(4)).requires_grad_()
    dist = CausalFactoredDistribution.from_logits(logits, input_lens=NVEC, relevance=relevance_matrix())
    blueprint = HEAD_NAMES.index("blueprint")
    start = sum(NVEC[:blueprint])  # the heads' logits are concatenated in HEAD_NAMES order
    expected = (
        dist.read_probability()[blueprint - 1]
        * torch.distributions.Categorical(logits=logits[start : start + NVEC[blueprint]]).entropy()
    )
    bonus = dist.argument_entropy("blueprint")
    assert float(bonus.detach()) == pytest.approx(float(expected.detach()))
    bonus.backward()
    grad = logits.grad
    outside = torch.cat([grad[:start], grad[start + NVEC[blueprint] :]])
    assert torch.count_nonzero(outside) == 0  # P(read) is held constant: the op's choice is not pushed
    assert torch.count_nonzero(grad[start : start + NVEC[blueprint]]) > 0
    with pytest.raises(ValueError, match="joint head"):
        dist.argument_entropy(HEAD_NAMES[0])


def test_the_learners_blueprint_bonus_is_the_coefficient_times_the_masked_mean_and_off_at_zero():
    dist = CausalFactoredDistribution.from_logits(
        torch.randn(2, 3, sum(NVEC), generator=torch.Generator().manual_seed(5)),
        input_lens=NVEC,
        relevance=relevance_matrix(),
    )
    mask = torch.tensor([[True, True, False], [True, False, False]])  # padded steps never count
    per_step = dist.argument_entropy("blueprint")
    expected = 0.3 * (per_step[0, 0] + per_step[0, 1] + per_step[1, 0]) / 3
    assert float(blueprint_entropy_bonus(dist, mask, 0.3)) == pytest.approx(float(expected))
    assert float(blueprint_entropy_bonus(dist, mask, 0.0)) == 0.0


def test_the_blueprint_bonus_reaches_the_learner_and_a_negative_one_is_refused():
    assert build_ppo_config(TrainConfig(blueprint_entropy_coeff=0.1)).learner_config_dict[BLUEPRINT_ENTROPY_KEY] == 0.1
    assert build_ppo_config(TrainConfig()).learner_config_dict[BLUEPRINT_ENTROPY_KEY] == 0.0
    with pytest.raises(ValueError, match="blueprint_entropy_coeff=-0.1"):
        TrainConfig(blueprint_entropy_coeff=-0.1)


def _module(**config: float) -> tuple[MorphoPolicyModule, MorphogeneticEnv]:
    env = MorphogeneticEnv({"max_epochs": 5, "num_shards": 6, "slots": ["r0c0", "r1c0"]})
    torch.manual_seed(0)
    module = MorphoPolicyModule(
        observation_space=env.observation_space,
        action_space=gym.spaces.MultiDiscrete(env.action_space.nvec),
        model_config=dict(MODEL_PRESETS["cpu"], max_seq_len=6, **config),
    )
    return module, env


def test_the_prune_prior_makes_an_untrained_policy_prune_e_to_the_prior_times_as_often_as_it_waits():
    """docs/learning.md section 8: with PRUNE at a logit of -3, a TRAINING seed (WAIT or PRUNE legal) is pruned
    with probability e^-3 / (1 + e^-3) an epoch, not 1/2; the other ops keep their near-uniform start."""
    for prior in (0.0, -3.0):
        module, env = _module(prune_logit=prior)
        env.reset(seed=0)
        env.step(lifecycle_action(Op.GERMINATE, 0))
        env.model.slot("r0c0").metrics.age = 6  # old enough to prune
        obs = env._observation()
        with torch.no_grad():
            logits = module.forward_inference(_batch(obs, module))[Columns.ACTION_DIST_INPUTS][0, 0, : NVEC[0]]
        probs = torch.softmax(logits, -1)
        prune, wait = float(probs[encode_joint(Op.PRUNE, 0)]), float(probs[encode_joint(Op.WAIT, None)])
        assert prune / wait == pytest.approx(math.exp(prior), rel=0.05), prior


def test_fossilize_prior_makes_an_untrained_policy_commit_a_holding_seed_e_to_the_prior_times_as_often_as_it_waits():
    """With FOSSILIZE at a logit of +3, a seed in HOLDING is committed e^3 times as often as the policy waits."""
    for prior in (0.0, 3.0):
        module, env = _module(fossilize_logit=prior)
        env.cfg = dataclasses.replace(env.cfg, auto_forward=False)
        env.reset(seed=0)
        slot = env.model.slot("r0c0")
        drive_to(slot, Stage.HOLDING)
        slot.metrics.record_contribution(0.05)  # G5: a seed that contributes may be fossilized
        obs = env._observation()
        assert obs["action_mask"][: NVEC[0]][encode_joint(Op.FOSSILIZE, 0)]
        with torch.no_grad():
            logits = module.forward_inference(_batch(obs, module))[Columns.ACTION_DIST_INPUTS][0, 0, : NVEC[0]]
        probs = torch.softmax(logits, -1)
        fossilize, wait = float(probs[encode_joint(Op.FOSSILIZE, 0)]), float(probs[encode_joint(Op.WAIT, None)])
        assert fossilize / wait == pytest.approx(math.exp(prior), rel=0.05), prior


def _batch(obs: dict[str, np.ndarray], module: MorphoPolicyModule, batch: int = 1, time: int = 1) -> dict:
    state = {k: torch.as_tensor(v)[None].repeat(batch, 1) for k, v in module.get_initial_state().items()}
    tensors = {
        k: torch.as_tensor(np.asarray(v))[None, None].repeat(batch, time, *([1] * np.asarray(v).ndim))
        for k, v in obs.items()
    }
    return {Columns.OBS: tensors, Columns.STATE_IN: state}


def test_module_never_samples_a_masked_action_and_values_have_shape_b_t():
    module, env = _module()
    obs, _ = env.reset(seed=0)
    with torch.no_grad():
        out = module.forward_exploration(_batch(obs, module, batch=512))
        values = module.compute_values(_batch(obs, module, batch=3, time=4))
    assert values.shape == (3, 4)
    dist = module.get_exploration_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
    actions = dist.sample()[:, 0]  # [512, heads]
    joint_mask = obs["action_mask"][: NVEC[0]]
    assert all(joint_mask[j] for j in actions[:, 0].tolist())
    blueprint_mask = obs["action_mask"][NVEC[0] : NVEC[0] + len(Blueprint)]
    assert all(blueprint_mask[b] for b in actions[:, 1].tolist())
    assert len(set(actions[:, 0].tolist())) > 1  # it explores among the legal ones


def test_acting_needs_no_eval_mode_because_no_layer_depends_on_the_mode():
    """forward_exploration and forward_inference skip RLlib's eval()/train() switch (a cost every step in an env
    runner): sound only while the module computes the same in both modes and acting leaves its mode alone."""
    module, env = _module()
    obs, _ = env.reset(seed=0)
    module.train()
    with torch.no_grad():
        acting = [
            module.forward_exploration(_batch(obs, module, batch=2)),
            module.forward_inference(_batch(obs, module, batch=2)),
        ]
        assert module.training  # acting did not switch it
        module.eval()
        want = module._forward(_batch(obs, module, batch=2))
    for got in acting:
        torch.testing.assert_close(got[Columns.ACTION_DIST_INPUTS], want[Columns.ACTION_DIST_INPUTS], rtol=0, atol=0)
        for key in ("h", "c"):
            torch.testing.assert_close(got[Columns.STATE_OUT][key], want[Columns.STATE_OUT][key], rtol=0, atol=0)
    mode_dependent = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._NormBase)
    assert not [name for name, layer in module.named_modules() if isinstance(layer, mode_dependent)]


@pytest.mark.parametrize("preset", ["cpu", "gpu"])
def test_one_step_at_a_time_gives_what_the_whole_sequence_gives(preset):
    """Sampling steps the LSTM one cell call at a time on the CPU; the learner runs nn.LSTM over whole episodes.
    Both must give the same outputs and carried state (to float tolerance: the kernels differ)."""
    env = MorphogeneticEnv({"max_epochs": 5, "num_shards": 6, "slots": ["r0c0", "r1c0"]})
    torch.manual_seed(1)
    module = MorphoPolicyModule(
        observation_space=env.observation_space,
        action_space=gym.spaces.MultiDiscrete(env.action_space.nvec),
        model_config=dict(MODEL_PRESETS[preset], max_seq_len=6),
    )
    obs, _ = env.reset(seed=0)
    observations = [obs]
    for _ in range(4):
        obs, *_ = env.step(np.zeros(len(env.action_space.nvec), dtype=np.int64))
        observations.append(obs)
    sequence = {k: torch.as_tensor(np.stack([o[k] for o in observations]))[None] for k in obs}  # [1, T, ...]
    initial = {k: torch.as_tensor(v)[None] for k, v in module.get_initial_state().items()}
    with torch.no_grad():
        whole = module.forward_train({Columns.OBS: sequence, Columns.STATE_IN: initial})
        state, steps = initial, []
        for t in range(len(observations)):
            out = module.forward_exploration(
                {Columns.OBS: {k: v[:, t : t + 1] for k, v in sequence.items()}, Columns.STATE_IN: state}
            )
            steps.append(out[Columns.ACTION_DIST_INPUTS])
            state = out[Columns.STATE_OUT]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole[Columns.ACTION_DIST_INPUTS], rtol=1e-5, atol=1e-5)
    for key in ("h", "c"):
        torch.testing.assert_close(state[key], whole[Columns.STATE_OUT][key], rtol=1e-5, atol=1e-5)
