"""The slot-equivariant policy (policy/slot_module.py) and its slot-conditioned distribution (slot_distribution.py),
built directly on spaces of any slot count (no env, no Ray cluster)."""

from __future__ import annotations

import itertools
import math
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from esper_ray.contracts.actions import (
    BLUEPRINT_NONE_INDEX,
    HEAD_NAMES,
    HEAD_SIZES_AFTER_JOINT,
    MAX_BLUEPRINTS,
    MAX_SLOTS,
    RELEVANT_HEADS,
    SLOTTED_OPS,
    Blueprint,
    Op,
)
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.train_config import SLOT_ARCHITECTURES, TrainConfig
from esper_ray.env.masks import action_nvec
from esper_ray.env.observation import BASE_FEATURES, SLOT_BLOCK, SLOT_PRESENT, feature_size, slot_offset
from esper_ray.policy.distribution import relevance_matrix
from esper_ray.policy.layout import LAYOUT_KEY, architecture_of, check_layout, policy_layout
from esper_ray.policy.rl_module import MASKED_LOGIT, MODEL_PRESETS, MorphoPolicyModule
from esper_ray.policy.slot_distribution import (
    ARGUMENT_SIZE,
    SlotConditionedDistribution,
    slot_joint_size,
    slot_logits_size,
    slot_relevance_matrix,
)
from esper_ray.policy.slot_module import SLOT_MODEL_PRESETS, SlotPolicyModule, slot_spaces
from esper_ray.train.commands.evaluate import untrained_positions_line
from esper_ray.train.rllib.learner import blueprint_entropy_bonus
from esper_ray.train.rllib.ppo_config import build_ppo_config
from esper_ray.train.rllib.rounds import MODULE_PATH, restore

OPS = len(SLOTTED_OPS)
BLUEPRINTS = len(Blueprint)
"""Built-in blueprint ids (NOOP included); a plug-in's are BLUEPRINTS .. MAX_BLUEPRINTS - 1."""
COSTS = 2


def make_module(num_slots: int, seed: int = 0, architecture: str = "slots", **config: float) -> SlotPolicyModule:
    observation_space, action_space = slot_spaces(num_slots)
    torch.manual_seed(seed)
    return SlotPolicyModule(
        observation_space=observation_space,
        action_space=action_space,
        model_config=dict(
            SLOT_MODEL_PRESETS["cpu"], max_seq_len=4, **{LAYOUT_KEY: policy_layout(architecture)}, **config
        ),
    )


MIXINGS = pytest.mark.parametrize("architecture", SLOT_ARCHITECTURES)
"""The tests of what the slot-shared network guarantees hold for both ways of mixing slots (attention, masked mean)."""


@dataclass
class Host:
    """What an observation says of a host, slot by slot, independent of the slot positions it is laid out in."""

    run: np.ndarray  # [BASE_FEATURES]
    blocks: np.ndarray  # [n, SLOT_BLOCK], present = 1
    blueprints: np.ndarray  # [n] blueprint ids
    costs: np.ndarray  # [n, MAX_BLUEPRINTS, COSTS] what each blueprint would add there
    legal: np.ndarray  # [n, OPS] 0/1: which slotted ops the mask allows in the slot
    arguments: np.ndarray  # [ARGUMENT_SIZE] 0/1: the argument heads' mask


def random_host(num_slots: int, seed: int) -> Host:
    rng = np.random.default_rng(seed)
    blocks = rng.uniform(-1.0, 1.0, (num_slots, SLOT_BLOCK)).astype(np.float32)
    blocks[:, SLOT_PRESENT] = 1.0
    arguments = np.ones(ARGUMENT_SIZE, dtype=np.int8)
    arguments[[0, 5, 9]] = 0  # some blueprints masked, as a host's topology masks the others'
    return Host(
        run=rng.uniform(-1.0, 1.0, BASE_FEATURES).astype(np.float32),
        blocks=blocks,
        blueprints=rng.choice([*range(MAX_BLUEPRINTS), BLUEPRINT_NONE_INDEX], num_slots),
        costs=rng.uniform(0.0, 1.0, (num_slots, MAX_BLUEPRINTS, COSTS)).astype(np.float32),
        legal=(rng.random((num_slots, OPS)) < 0.6).astype(np.int8),
        arguments=arguments,
    )


def observation(host: Host, num_slots: int, order: list[int] | None = None) -> dict[str, np.ndarray]:
    """The observation of `host` in a space of `num_slots` positions: position i holds the host's slot order[i];
    positions past the host's slots are absent (zero features, blueprint NONE, joint entries masked), as the env
    lays them out."""
    order = list(range(len(host.blocks))) if order is None else order
    features = np.zeros(BASE_FEATURES + SLOT_BLOCK * num_slots, dtype=np.float32)
    features[:BASE_FEATURES] = host.run
    blueprints = np.full(num_slots, BLUEPRINT_NONE_INDEX, dtype=np.int64)
    costs = np.zeros((num_slots, MAX_BLUEPRINTS, COSTS), dtype=np.float32)
    joint = np.zeros(slot_joint_size(num_slots), dtype=np.int8)
    joint[0] = 1
    for position, slot in enumerate(order):
        features[slot_offset(position) : slot_offset(position) + SLOT_BLOCK] = host.blocks[slot]
        blueprints[position] = host.blueprints[slot]
        costs[position] = host.costs[slot]
        for o in range(OPS):
            joint[1 + o * num_slots + position] = host.legal[slot, o]
    mask = np.concatenate([joint, host.arguments])
    return {"features": features, "blueprint_ids": blueprints, "blueprint_costs": costs, "action_mask": mask}


def batch_of(module: SlotPolicyModule, observations: list[dict[str, np.ndarray]]) -> dict:
    """One sequence [1, T] of the observations, from the initial state."""
    obs = {k: torch.as_tensor(np.stack([o[k] for o in observations]))[None] for k in observations[0]}
    state = {k: torch.as_tensor(v)[None] for k, v in module.get_initial_state().items()}
    return {Columns.OBS: obs, Columns.STATE_IN: state}


@dataclass
class Outputs:
    wait: torch.Tensor  # [T]
    ops: torch.Tensor  # [T, OPS, S] probabilities of the joint entries
    blueprint: torch.Tensor  # [T, S, MAX_BLUEPRINTS] each slot's blueprint distribution
    value: torch.Tensor  # [T]


def outputs(module: SlotPolicyModule, observations: list[dict[str, np.ndarray]]) -> Outputs:
    batch = batch_of(module, observations)
    with torch.no_grad():
        out = module.forward_train(batch)
        value = module.compute_values(batch, embeddings=out[Columns.EMBEDDINGS])[0]
    dist = module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS][0])
    joint = torch.softmax(dist.joint.logits, -1)
    return Outputs(joint[:, 0], joint[:, 1:].unflatten(-1, (OPS, module.num_slots)), dist.arguments[0].exp(), value)


def test_slot_spaces_at_max_slots_are_the_envs_and_the_joint_layout_is_contracts():
    observation_space, action_space = slot_spaces(MAX_SLOTS)
    assert observation_space["features"].shape == (feature_size(),)
    assert [int(n) for n in action_space.nvec] == action_nvec()
    assert slot_relevance_matrix(MAX_SLOTS) == relevance_matrix()
    assert SlotConditionedDistribution.required_input_dim(action_space) == slot_logits_size(MAX_SLOTS)


@MIXINGS
def test_permuting_the_slots_permutes_op_and_blueprint_probabilities_and_leaves_wait_and_value_alone(architecture):
    module = make_module(5, architecture=architecture)
    hosts = [random_host(5, seed) for seed in range(3)]  # three steps, so the LSTM's state carries them
    perm = [3, 0, 4, 1, 2]
    plain = outputs(module, [observation(h, 5) for h in hosts])
    permuted = outputs(module, [observation(h, 5, order=perm) for h in hosts])
    torch.testing.assert_close(permuted.ops, plain.ops[:, :, perm], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(permuted.blueprint, plain.blueprint[:, perm], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(permuted.wait, plain.wait, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(permuted.value, plain.value, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(plain.ops, plain.ops[:, :, perm], atol=1e-6)  # the permutation did move something


def test_the_mean_mixing_replaces_the_attention_and_a_flat_layout_is_not_this_modules():
    attention, mean = make_module(3), make_module(3, architecture="slots-mean")
    assert hasattr(attention, "attention") and not hasattr(attention, "mean_mixing")
    assert hasattr(mean, "mean_mixing") and not hasattr(mean, "attention")
    host = random_host(3, seed=13)
    assert not torch.allclose(outputs(attention, [observation(host, 3)]).ops, outputs(mean, [observation(host, 3)]).ops)
    with pytest.raises(ValueError, match=r"^policy: architecture 'flat': this module is \['slots', 'slots-mean'\]$"):
        make_module(3, architecture="flat")


@MIXINGS
def test_the_weight_count_does_not_depend_on_the_slot_count(architecture):
    counts = {s: sum(p.numel() for p in make_module(s, architecture=architecture).parameters()) for s in (2, 12)}
    assert counts[2] == counts[12], counts


@MIXINGS
def test_one_set_of_weights_runs_on_2_5_and_12_slot_spaces_and_a_host_reads_the_same_in_each(architecture):
    small = make_module(2, architecture=architecture)
    host = random_host(2, seed=4)
    want = outputs(small, [observation(host, 2)])
    for num_slots in (5, 12):
        module = make_module(num_slots, seed=num_slots, architecture=architecture)
        module.load_state_dict(small.state_dict())  # strict: the same parameters, the same shapes
        got = outputs(module, [observation(host, num_slots)])
        torch.testing.assert_close(got.ops[:, :, :2], want.ops, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got.blueprint[:, :2], want.blueprint, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got.value, want.value, rtol=1e-4, atol=1e-6)
        full = outputs(module, [observation(random_host(num_slots, seed=5), num_slots)])  # a host that fills them
        assert full.ops.shape == (1, OPS, num_slots) and torch.isfinite(full.value).all()


def test_two_slots_with_different_features_get_different_blueprint_distributions():
    module = make_module(2)
    host = random_host(2, seed=6)
    host.legal[:] = 1
    host.blueprints[:] = int(Blueprint.CONV_LIGHT)
    twins = Host(host.run, host.blocks[[0, 0]], host.blueprints, host.costs[[0, 0]], host.legal, host.arguments)
    different = outputs(module, [observation(host, 2)]).blueprint[0]
    same = outputs(module, [observation(twins, 2)]).blueprint[0]
    torch.testing.assert_close(same[0], same[1], rtol=0, atol=1e-6)  # identical slots: identical rows
    assert float((different[0] - different[1]).abs().max()) > 1e-4  # at initialisation already; float noise is 1e-7


def test_two_slots_that_differ_only_in_their_blueprint_costs_get_different_blueprint_distributions():
    module = make_module(2)
    host = random_host(2, seed=11)
    host.legal[:] = 1
    twins = Host(host.run, host.blocks[[0, 0]], host.blueprints[[0, 0]], host.costs[[0, 0]], host.legal, host.arguments)
    costly = Host(twins.run, twins.blocks, twins.blueprints, twins.costs.copy(), twins.legal, twins.arguments)
    costly.costs[1] += 2.0  # slot 1: every blueprint would add more there
    same = outputs(module, [observation(twins, 2)]).blueprint[0]
    differ = outputs(module, [observation(costly, 2)]).blueprint[0]
    torch.testing.assert_close(same[0], same[1], rtol=0, atol=1e-7)
    assert float((differ[0] - differ[1]).abs().max()) > 1e-5  # at initialisation already; float noise is 1e-8


def test_every_plugin_blueprint_is_scored_from_one_shared_embedding_and_its_costs():
    """Two plug-in names with the same costs get the same logit, and a slot holding one reads like a slot holding the
    other: no plug-in name has an embedding row of its own that no run has trained."""
    module = make_module(2)
    with torch.no_grad():  # weights far from their near-uniform start, as training leaves them
        for parameter in (module.embedding.weight, module.blueprint_score.weight):
            parameter.normal_(std=1.0)
    host = random_host(2, seed=12)
    host.legal[:] = 1
    first, second = BLUEPRINTS, MAX_BLUEPRINTS - 1  # the first and last plug-in entries
    host.costs[:, second] = host.costs[:, first]
    swapped = Host(host.run, host.blocks, host.blueprints.copy(), host.costs, host.legal, host.arguments)
    host.blueprints[0], swapped.blueprints[0] = first, second
    plain, other = outputs(module, [observation(host, 2)]), outputs(module, [observation(swapped, 2)])
    torch.testing.assert_close(plain.blueprint[..., first], plain.blueprint[..., second], rtol=0, atol=1e-7)
    torch.testing.assert_close(other.blueprint, plain.blueprint, rtol=0, atol=1e-7)
    torch.testing.assert_close(other.ops, plain.ops, rtol=0, atol=1e-7)
    built_in = int(Blueprint.CONV_LIGHT)
    host.costs[:, built_in] = host.costs[:, first]
    again = outputs(module, [observation(host, 2)])  # a built-in keeps its own row: another score at equal costs
    assert float((again.blueprint[..., built_in] - again.blueprint[..., first]).abs().max()) > 1e-3


@MIXINGS
def test_absent_slots_are_masked_and_do_not_change_what_the_present_slots_get(architecture):
    host = random_host(3, seed=7)
    host.legal[:] = 1
    small, large = make_module(3, architecture=architecture), make_module(8, architecture=architecture)
    large.load_state_dict(small.state_dict())
    three = outputs(small, [observation(host, 3)])
    padded = outputs(large, [observation(host, 8)])
    assert torch.all(padded.ops[:, :, 3:] == 0)  # masked: probability exactly 0
    torch.testing.assert_close(padded.ops[:, :, :3], three.ops, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(padded.wait, three.wait, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(padded.blueprint[:, :3], three.blueprint, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(padded.value, three.value, rtol=1e-4, atol=1e-6)


def test_a_space_with_no_slot_present_gives_finite_outputs_and_only_wait_and_attention_always_has_a_key():
    """Attention whose keys are all masked is undefined: torch's fast path (eval mode, no gradients) gave NaN on one
    call and other values on the next, the slow path 0. The run token, never masked, leaves every query a key."""
    module = make_module(4)
    masks = []
    module.attention.register_forward_pre_hook(
        lambda _, args, kwargs: masks.append(kwargs["key_padding_mask"].clone()), with_kwargs=True
    )
    empty = [observation(random_host(0, seed=8), 4)] * 2
    for training in (False, True):
        module.train(training)
        got = outputs(module, empty)
        assert torch.all(got.wait == 1) and torch.isfinite(got.value).all() and torch.isfinite(got.blueprint).all()
    assert masks and all(bool((~mask).any(-1).all()) for mask in masks)


def test_the_module_samples_only_legal_actions_and_their_logp_is_finite_over_a_batch_of_sequences():
    module = make_module(3)
    host = random_host(3, seed=10)
    obs = observation(host, 3)
    batch = batch_of(module, [obs] * 2)
    batch = {k: {n: v.expand(256, *v.shape[1:]) for n, v in part.items()} for k, part in batch.items()}
    with torch.no_grad():
        logits = module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS]  # [256, 2, L]
    dist = module.get_exploration_action_dist_cls().from_logits(logits)
    torch.manual_seed(0)
    actions = dist.sample()  # [256, 2, heads]
    joint = slot_joint_size(3)
    assert all(obs["action_mask"][j] for j in actions[..., 0].flatten().tolist())
    assert all(obs["action_mask"][joint + b] for b in actions[..., 1].flatten().tolist())
    assert len(set(actions[..., 0].flatten().tolist())) > 1
    assert torch.isfinite(dist.logp(actions)).all() and dist.logp(actions).max() < 0


def test_the_prune_and_fossilize_priors_land_on_every_slots_prune_and_fossilize_entries():
    """With all ops legal, an untrained policy picks PRUNE on any slot e^prune_logit times as often as it waits."""
    module = make_module(3, prune_logit=-3.0, fossilize_logit=2.0)
    host = random_host(3, seed=9)
    host.legal[:] = 1
    got = outputs(module, [observation(host, 3)])
    ratio = got.ops[0] / got.wait[0]  # [OPS, S]
    for op in SLOTTED_OPS:
        prior = {Op.PRUNE: -3.0, Op.FOSSILIZE: 2.0}.get(op, 0.0)
        want = torch.full((3,), math.exp(prior))
        torch.testing.assert_close(ratio[SLOTTED_OPS.index(op)], want, rtol=0.05, atol=0, msg=op.name)


@MIXINGS
def test_one_step_at_a_time_gives_what_the_whole_sequence_gives(architecture):
    """Sampling steps the LSTM one cell call at a time on the CPU; the learner runs nn.LSTM over whole episodes."""
    module = make_module(3, architecture=architecture)
    observations = [observation(random_host(3, seed), 3) for seed in range(4)]
    whole_batch = batch_of(module, observations)
    with torch.no_grad():
        whole = module.forward_train(whole_batch)
        state, steps = whole_batch[Columns.STATE_IN], []
        for t in range(len(observations)):
            obs = {k: v[:, t : t + 1] for k, v in whole_batch[Columns.OBS].items()}
            out = module.forward_exploration({Columns.OBS: obs, Columns.STATE_IN: state})
            steps.append(out[Columns.ACTION_DIST_INPUTS])
            state = out[Columns.STATE_OUT]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole[Columns.ACTION_DIST_INPUTS], rtol=1e-5, atol=1e-5)
    for key in ("h", "c"):
        torch.testing.assert_close(state[key], whole[Columns.STATE_OUT][key], rtol=1e-5, atol=1e-5)


# The distribution, on logits made directly.

TINY = 2  # slots of the enumerated space


def random_logits(seed: int, num_slots: int = TINY) -> torch.Tensor:
    """Float64 logits for `num_slots` slots, with a few joint and argument entries masked as the module masks them."""
    g = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(slot_logits_size(num_slots), generator=g, dtype=torch.float64)
    joint = slot_joint_size(num_slots)
    logits[[2, joint - 1]] = MASKED_LOGIT
    rows = logits[joint:].view(num_slots, ARGUMENT_SIZE)
    rows[:, [0, 3]] = MASKED_LOGIT  # blueprints NOOP and NORM masked in every row
    return logits


def executed_actions(logits: torch.Tensor, num_slots: int = TINY) -> dict[tuple[int, ...], float]:
    """Brute force: P of every executed action (the joint index and the values of the heads its op reads; the other
    heads 0), from the layout's definition: slot(j) = (j - 1) % S and each slot's row split into the heads."""
    joint = slot_joint_size(num_slots)
    p_joint = torch.softmax(logits[:joint], -1).tolist()
    rows = logits[joint:].view(num_slots, ARGUMENT_SIZE)
    bounds = np.cumsum([0, *HEAD_SIZES_AFTER_JOINT])
    heads = [
        [torch.softmax(rows[s, a:b], -1).tolist() for a, b in zip(bounds[:-1], bounds[1:])] for s in range(num_slots)
    ]
    probability = {}
    for j in range(joint):
        op = Op.WAIT if j == 0 else SLOTTED_OPS[(j - 1) // num_slots]
        slot = 0 if j == 0 else (j - 1) % num_slots
        read = [h for h, name in enumerate(HEAD_NAMES[1:]) if name in RELEVANT_HEADS[op]]
        for values in itertools.product(*[range(HEAD_SIZES_AFTER_JOINT[h]) for h in read]):
            action = [0] * len(HEAD_SIZES_AFTER_JOINT)
            p = p_joint[j]
            for h, v in zip(read, values):
                action[h] = v
                p *= heads[slot][h][v]
            probability[(j, *action)] = p
    return probability


def test_logp_entropy_and_kl_match_a_brute_force_enumeration_of_every_executed_action():
    p_logits, q_logits = random_logits(0), random_logits(1)
    p = SlotConditionedDistribution.from_logits(p_logits, num_slots=TINY)
    q = SlotConditionedDistribution.from_logits(q_logits, num_slots=TINY)
    p_exact, q_exact = executed_actions(p_logits), executed_actions(q_logits)
    assert sum(p_exact.values()) == pytest.approx(1.0, abs=1e-9)
    support = [a for a, v in p_exact.items() if v > 0]
    actions = torch.tensor(support)
    want_logp = torch.tensor([math.log(p_exact[a]) for a in support], dtype=torch.float64)
    torch.testing.assert_close(p.logp(actions), want_logp, rtol=1e-9, atol=1e-9)
    unread = actions.clone()
    unread[:, 1:] = torch.where(torch.tensor(slot_relevance_matrix(TINY))[actions[:, 0]], unread[:, 1:], 1)
    torch.testing.assert_close(p.logp(unread), want_logp, rtol=1e-9, atol=1e-9)  # heads the op ignores: no effect
    entropy = -sum(v * math.log(v) for v in p_exact.values() if v > 0)
    kl = sum(v * (math.log(v) - math.log(q_exact[a])) for a, v in p_exact.items() if v > 0)
    assert float(p.entropy()) == pytest.approx(entropy, rel=1e-9)
    assert float(p.kl(q)) == pytest.approx(kl, rel=1e-9)
    heads = p.head_entropies()
    assert list(heads) == list(HEAD_NAMES)
    assert float(sum(heads.values())) == pytest.approx(entropy, rel=1e-9)


def test_the_entropy_bonus_does_not_push_the_op_slot_choice_through_the_argument_rows():
    """entropy()'s argument term holds pi_J constant: its gradient on the joint logits is H(pi_J)'s alone."""
    logits = random_logits(2).requires_grad_(True)
    SlotConditionedDistribution.from_logits(logits, num_slots=TINY).entropy().backward()
    joint = slot_joint_size(TINY)
    alone = logits.detach().clone().requires_grad_(True)
    SlotConditionedDistribution.from_logits(alone, num_slots=TINY).joint.entropy().backward()
    torch.testing.assert_close(logits.grad[:joint], alone.grad[:joint])
    assert logits.grad[joint:].abs().sum() > 0  # the rows' own entropies are still pushed
    dist = SlotConditionedDistribution.from_logits(logits.detach(), num_slots=TINY)
    bonus = blueprint_entropy_bonus(dist, torch.tensor(True), 0.5)  # the learner's blueprint bonus runs on it
    assert float(bonus) == pytest.approx(0.5 * float(dist.head_entropies()["blueprint"]), rel=1e-9)


def test_arguments_are_sampled_from_the_chosen_slots_row():
    """GERMINATE legal on slots 0 and 1 only; slot 0's row all but certainly picks blueprint 3, slot 1's 7."""
    logits = torch.full((slot_logits_size(TINY),), 0.0)
    joint = slot_joint_size(TINY)
    logits[:joint] = MASKED_LOGIT
    logits[[1, 2]] = 0.0  # GERMINATE on slot 0, on slot 1
    rows = logits[joint:].view(TINY, ARGUMENT_SIZE)
    rows[0, 3], rows[1, 7] = 40.0, 40.0
    dist = SlotConditionedDistribution.from_logits(logits.expand(4000, -1), num_slots=TINY)
    torch.manual_seed(0)
    actions = dist.sample()
    slot = actions[:, 0] - 1
    assert set(slot.tolist()) == {0, 1}
    assert torch.equal(actions[:, 1], torch.where(slot == 0, 3, 7))
    greedy = dist.to_deterministic().loc[0]
    assert int(greedy[1]) == (3 if int(greedy[0]) == 1 else 7)


# ------------------------------------------------------------------------------------- wiring (TrainConfig.policy)
def test_the_policy_setting_refuses_an_unknown_architecture_naming_the_choices():
    assert TrainConfig().policy == "flat"  # the default is unchanged
    with pytest.raises(ValueError, match=r"^policy='attention': choose one of \['flat', 'slots', 'slots-mean'\]$"):
        TrainConfig(policy="attention")


def test_a_runs_record_names_a_slots_policy_and_a_flat_ones_record_is_as_before():
    assert TrainConfig.from_mapping(TrainConfig(policy="slots").to_dict()).policy == "slots"
    assert "policy" not in TrainConfig().to_dict()  # flat: the record written before issue 75
    assert TrainConfig.from_mapping(TrainConfig().to_dict()).policy == "flat"


@pytest.mark.parametrize(
    ("policy", "module_class"),
    [("flat", MorphoPolicyModule), ("slots", SlotPolicyModule), ("slots-mean", SlotPolicyModule)],
)
def test_the_policy_setting_picks_the_module_its_presets_and_the_layouts_architecture(policy, module_class):
    spec = build_ppo_config(TrainConfig(policy=policy)).rl_module_spec
    presets = SLOT_MODEL_PRESETS if policy in SLOT_ARCHITECTURES else MODEL_PRESETS
    assert spec.module_class is module_class
    assert {k: spec.model_config[k] for k in presets["cpu"]} == presets["cpu"]
    assert spec.model_config[LAYOUT_KEY] == policy_layout(policy) and policy_layout(policy)["architecture"] == policy


@pytest.mark.parametrize(("saved", "run"), [("flat", "slots"), ("slots", "flat"), ("slots", "slots-mean")])
def test_a_checkpoint_of_the_other_architecture_is_refused_in_one_line(saved, run):
    with pytest.raises(
        ValueError,
        match=rf"^checkpoint c: its policy layout does not match this code's: architecture '{saved}' there, "
        rf"'{run}' here$",
    ):
        check_layout(policy_layout(saved), "checkpoint c", run)
    check_layout(policy_layout(saved), "checkpoint c", saved)
    check_layout(policy_layout(saved), "checkpoint c")  # eval and grow: the checkpoint's own architecture


def test_a_layout_saved_without_an_architecture_reads_as_flat():
    old = {k: v for k, v in policy_layout().items() if k != "architecture"}  # saved before issue 75
    assert architecture_of(old) == "flat"
    check_layout(old, "checkpoint c", "flat")
    check_layout(old, "checkpoint c")
    with pytest.raises(ValueError, match=r"architecture 'flat' there, 'slots' here$"):
        check_layout(old, "checkpoint c", "slots")


def _checkpoint_of(tmp_path: Path, layout: dict) -> Path:
    """A checkpoint folder holding only what the layout check reads (RLlib's class_and_ctor_args.pkl)."""
    module_dir = tmp_path / "ckpt" / MODULE_PATH
    module_dir.mkdir(parents=True)
    with (module_dir / "class_and_ctor_args.pkl").open("wb") as f:
        pickle.dump({"ctor_args_and_kwargs": ((), {"model_config": {LAYOUT_KEY: layout}})}, f)
    return tmp_path / "ckpt"


@pytest.mark.parametrize(("saved", "run"), [("flat", "slots"), ("slots", "flat")])
def test_a_resume_refuses_a_checkpoint_of_the_other_architecture_before_restoring(tmp_path, saved, run):
    checkpoint = _checkpoint_of(tmp_path, policy_layout(saved))

    class Algo:  # what restore reads of the algorithm before it restores anything
        config = build_ppo_config(TrainConfig(policy=run))

        def restore_from_path(self, path: str) -> None:
            raise AssertionError("restored a checkpoint of the other architecture")

    with pytest.raises(ValueError, match=rf"architecture '{saved}' there, '{run}' here$"):
        restore(Algo(), str(checkpoint))


def test_a_slots_policy_gets_no_untrained_positions_warning():
    trained = EnvConfig.from_mapping({"family": "digits-family"})  # members of 2 to 4 slots
    run = EnvConfig.from_mapping({"family": "digits-held-out-starved"})  # up to 6
    assert untrained_positions_line(trained, run) is not None  # flat: positions of their own
    assert untrained_positions_line(trained, run, "slots") is None  # slots: one set of weights reads every one
