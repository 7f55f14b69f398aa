"""A policy for any host (issue 68 item 3): spaces sized for MAX_SLOTS whatever the host, absent slot positions
zero and masked, per-slot descriptors, slot statistics pooled over positions, and a checkpoint's layout checked."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.utils.filter import MeanStdFilter as PerColumnMeanStd

from esper_ray.cli import main
from esper_ray.contracts.actions import (
    BLUEPRINT_NONE_INDEX,
    MAX_BLUEPRINTS,
    MAX_SLOTS,
    SLOTTED_OPS,
    Blueprint,
    Op,
    encode_joint,
    topology_blueprints,
)
from esper_ray.contracts.controllers import FixedPlan, FixedSeed
from esper_ray.contracts.host import SlotSpec
from esper_ray.env.masks import decode_action, head_offsets
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.env.observation import (
    SLOT_BLOCK,
    SLOT_DEPTH,
    SLOT_FEATURES,
    SLOT_PRESENT,
    SLOT_TOPOLOGY,
    SLOT_WIDTH,
    feature_size,
    slot_descriptors,
    slot_offset,
)
from esper_ray.policy import layout
from esper_ray.policy.feature_filter import FEATURES, SLOTS, FeatureMeanStdFilter
from esper_ray.policy.fixed import FixedPlanController
from esper_ray.policy.heuristic import HeuristicController
from esper_ray.policy.layout import check_layout, policy_layout, saved_layout
from esper_ray.train.folders.checkpoints import resolve_checkpoint
from esper_ray.train.rllib.rounds import MODULE_PATH

PLUGIN = "tests.any_host_parts"


def toy_env(host: str, blocks: int, **kw) -> MorphogeneticEnv:
    return MorphogeneticEnv(
        {
            "task": "toy-blobs",
            "plugins": [PLUGIN],
            "host_preset": host,
            "slots": [f"h{i}" for i in range(blocks)],
            "max_epochs": 3,
            **kw,
        }
    )


def host_params(host: str, blocks: int) -> int:
    env = toy_env(host, blocks)
    env.reset(seed=0)
    return env.model.host_params


def block(features: np.ndarray, i: int) -> np.ndarray:
    return features[slot_offset(i) : slot_offset(i) + SLOT_BLOCK]


# ------------------------------------------------------------------------------------------------ the spaces
def test_a_2_slot_and_a_4_slot_host_have_the_same_spaces_and_observation_shapes():
    two, four = toy_env("any-mlp-2", 2), toy_env("any-mlp-4", 4)
    assert two.observation_space == four.observation_space and two.action_space == four.action_space
    obs2, _ = two.reset(seed=0)
    obs4, _ = four.reset(seed=0)
    for key in obs2:
        assert obs2[key].shape == obs4[key].shape
    assert obs2[FEATURES].shape == (feature_size(),) and obs2["blueprint_ids"].shape == (MAX_SLOTS,)
    assert two.observation_space.contains(obs2) and four.observation_space.contains(obs4)


def test_absent_slot_positions_are_zero_none_and_masked_in_the_joint_head():
    env = toy_env("any-mlp-2", 2, max_epochs=4)
    obs, _ = env.reset(seed=0)
    joint = head_offsets()["op_slot"]
    for _ in range(4):
        features, mask = obs[FEATURES], obs["action_mask"][joint]
        for i in range(2, MAX_SLOTS):
            assert not block(features, i).any()
            assert obs["blueprint_ids"][i] == BLUEPRINT_NONE_INDEX
            assert not any(mask[encode_joint(op, i)] for op in SLOTTED_OPS)
        assert mask[encode_joint(Op.GERMINATE, 0)] or mask[encode_joint(Op.GERMINATE, 1)] or obs[FEATURES][0] > 0
        obs, _, terminated, _, _ = env.step(env.action_space.sample())  # samples only legal actions
        if terminated:
            break
    action = np.zeros(7, dtype=np.int64)
    action[0] = encode_joint(Op.GERMINATE, 5)
    with pytest.raises(ValueError, match="GERMINATE on slot position 5, which this host does not have"):
        decode_action(action, env._mask(), env.slot_ids)


def test_the_descriptors_say_where_each_slot_sits_on_any_host():
    env = toy_env("any-mlp-4", 4)
    obs, _ = env.reset(seed=0)
    blocks = [block(obs[FEATURES], i) for i in range(4)]
    assert [b[SLOT_PRESENT] for b in blocks] == [1.0] * 4
    np.testing.assert_allclose([b[SLOT_DEPTH] for b in blocks], [0, 1 / 3, 2 / 3, 1], atol=1e-6)
    np.testing.assert_allclose([b[SLOT_WIDTH] for b in blocks], [0.5] * 4)  # log2(32) / 10
    assert [list(b[SLOT_TOPOLOGY]) for b in blocks] == [[0.0, 0.0, 1.0]] * 4  # cnn, transformer, vector
    # a CNN host's slots: depth in forward order (r0c1 before r1c1 before r0c2), not the action order (row-major)
    specs = [
        SlotSpec("r0c1", (16, 8, 8), "cnn"),
        SlotSpec("r0c2", (32, 4, 4), "cnn"),
        SlotSpec("r1c1", (16, 4, 4), "cnn"),
    ]
    d = slot_descriptors(specs, ["r0c1", "r0c2", "r1c1"])
    np.testing.assert_allclose(d[:, 1], [0.0, 1.0, 0.5])
    np.testing.assert_allclose(d[:, 2], [0.4, 0.5, 0.4])
    assert d[:, 3:].tolist() == [[1.0, 0.0, 0.0]] * 3


def test_a_host_with_more_slots_than_the_maximum_is_refused_in_one_line():
    with pytest.raises(
        ValueError,
        match=rf"^host 'any-mlp-{MAX_SLOTS + 1}' has {MAX_SLOTS + 1} slots; the policy holds at most "
        rf"MAX_SLOTS={MAX_SLOTS} \(choose fewer with `slots`\)$",
    ):
        toy_env(f"any-mlp-{MAX_SLOTS + 1}", MAX_SLOTS + 1)
    fewer = toy_env(f"any-mlp-{MAX_SLOTS + 1}", MAX_SLOTS)  # fewer of its slots fit
    assert fewer.slot_ids == [f"h{i}" for i in range(MAX_SLOTS)]


def test_the_heuristic_and_fixed_controllers_act_on_a_4_slot_host():
    env = toy_env("any-mlp-4", 4)
    obs, _ = env.reset(seed=0)
    plan = FixedPlan((FixedSeed(Blueprint.MLP, "h3"),))
    action = FixedPlanController(env.slot_ids, 3, plan, min_training_epochs=1).act(obs)
    assert decode_action(action, env._mask(), env.slot_ids).slot == "h3"
    heuristic = HeuristicController(env.slot_ids, 3, topology="vector")
    for _ in range(3):
        obs, _, terminated, _, _ = env.step(heuristic.act(obs))  # a masked action would raise
    assert terminated


# ------------------------------------------------------------------------------------------ the pooled filter
def filter_for(space: gym.Space) -> FeatureMeanStdFilter:
    feature_filter = FeatureMeanStdFilter(clip_by_value=10.0)
    feature_filter.input_observation_space = space
    return feature_filter


def test_a_slot_position_never_present_in_training_is_normalised_with_the_same_features_statistics():
    """Trained on 2-slot hosts, run on a host with a slot in position 5: its features are normalised by the
    statistics of the same feature in positions 0 and 1 (per position, Ray's filter sends it to the clip bound)."""
    env = toy_env("any-mlp-2", 2)
    rng = np.random.default_rng(0)
    pooled, per_column = filter_for(env.observation_space), PerColumnMeanStd(np.array([feature_size()]), clip=10.0)
    seen = []
    for _ in range(200):
        x = np.zeros(feature_size(), np.float32)
        x[:23] = rng.normal(size=23)
        for i in range(2):
            x[slot_offset(i) : slot_offset(i) + SLOT_FEATURES] = rng.normal(2.0 + i, 1.0 + i, SLOT_FEATURES)
            x[slot_offset(i) + SLOT_FEATURES : slot_offset(i) + SLOT_BLOCK] = [1.0, i, 0.4, 0.0, 0.0, 1.0]
            seen.append(x[slot_offset(i) : slot_offset(i) + SLOT_FEATURES].astype(np.float64))
        pooled.normalize(x, update=True)
        per_column(x, update=True)
    seen = np.array(seen)
    assert pooled._filters[SLOTS].running_stats.n == 400  # fed by the present slots only
    x = np.zeros(feature_size(), np.float32)
    measured = np.full(SLOT_FEATURES, 3.0, np.float32)
    descriptors = np.array([1.0, 0.7, 0.5, 0.0, 0.0, 1.0], np.float32)
    for i in (0, 5):
        x[slot_offset(i) : slot_offset(i) + SLOT_BLOCK] = [*measured, *descriptors]
    out = pooled.normalize(x, update=False)
    expected = (3.0 - seen.mean(axis=0)) / seen.std(axis=0, ddof=1)
    np.testing.assert_allclose(block(out, 5)[:SLOT_FEATURES], expected, rtol=1e-4)
    np.testing.assert_array_equal(block(out, 5), block(out, 0))  # a position means the same wherever it is
    np.testing.assert_array_equal(block(out, 5)[SLOT_FEATURES:], descriptors)  # descriptors pass as they are
    assert not any(block(out, i).any() for i in (1, 2, 3, 4, 6, 7))  # absent positions come out zero
    per_position = per_column(x, update=False)
    assert np.abs(block(per_position, 5)[:SLOT_FEATURES]).min() == 10.0  # what pooling mends: every column clipped


def test_the_pooled_statistics_are_merged_across_runners_like_the_base_ones():
    space = toy_env("any-mlp-2", 2).observation_space
    driver, runners = filter_for(space), [filter_for(space) for _ in range(2)]
    merged = driver.get_state()
    rng = np.random.default_rng(1)
    for _ in range(2):
        for present, runner in zip((1, 2), runners):
            runner.set_state(merged)
            for _ in range(5):
                x = np.zeros(feature_size(), np.float32)
                for i in range(present):
                    x[slot_offset(i) : slot_offset(i) + SLOT_FEATURES] = rng.normal(size=SLOT_FEATURES)
                    x[slot_offset(i) + SLOT_PRESENT] = 1.0
                runner.normalize(x, update=True)
        merged = driver.merge_states([runner.get_state() for runner in runners])
    assert driver._filters[None].running_stats.n == 2 * 2 * 5
    assert driver._filters[SLOTS].running_stats.n == 2 * (1 + 2) * 5


# ------------------------------------------------------------------------------------------- the checkpoint
def test_a_checkpoint_of_another_layout_is_refused_naming_what_differs():
    check_layout(policy_layout(), "checkpoint c")
    other = {**policy_layout(), "max_slots": 4, "blueprints": ["noop", "conv_heavy"]}
    with pytest.raises(
        ValueError,
        match=rf"^checkpoint c: its policy layout does not match this code's: max_slots 4 "
        rf"there, {MAX_SLOTS} here; blueprints \['noop', 'conv_heavy'\] there, \['noop', ",
    ):
        check_layout(other, "checkpoint c")
    with pytest.raises(ValueError, match=r"^checkpoint c: records no policy layout: it was saved before"):
        check_layout(None, "checkpoint c")
    assert policy_layout()["blueprints"][1:] == [b.key for b in Blueprint][1:]
    assert set(b.key for b in topology_blueprints("vector") if isinstance(b, Blueprint)) <= set(
        policy_layout()["blueprints"]
    )


def test_a_checkpoint_saved_before_the_blueprint_vocabulary_and_costs_is_refused_in_one_line():
    """Its blueprint head had 13 entries and its observation no blueprint_costs (issue 75)."""
    old = {k: v for k, v in policy_layout("slots").items() if k not in ("max_blueprints", "blueprint_costs")}
    with pytest.raises(ValueError) as err:
        check_layout(old, "checkpoint c")
    assert str(err.value).startswith(
        f"checkpoint c: its policy layout does not match this code's: max_blueprints None there, {MAX_BLUEPRINTS} "
        "here; blueprint_costs None there, ['params', 'flops', "
    )
    assert "\n" not in str(err.value)


@pytest.mark.expensive
def test_a_policy_trained_on_a_3_slot_host_evaluates_on_a_2_slot_and_a_4_slot_host(
    ray_local, tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--plugins",
                PLUGIN,
                "--task",
                "toy-blobs",
                "--slots",
                "h0",
                "h1",
                "h2",
                "--rounds",
                "2",
                "--envs",
                "1",
                "--cpus-per-env",
                "0.5",
                "--max-epochs",
                "3",
                "--episodes-per-env",
                "1",
                "--output",
                str(run),
            ]
        )
        == 0
    )
    capsys.readouterr()
    for host, blocks in (("any-mlp-2", 2), ("any-mlp-4", 4)):
        slots = "[" + ", ".join(f"h{i}" for i in range(blocks)) + "]"
        assert (
            main(
                [
                    "eval",
                    "--checkpoint",
                    str(run),
                    "--episodes",
                    "1",
                    "--json",
                    "--env",
                    f"host_preset={host}",
                    "--env",
                    f"slots={slots}",
                ]
            )
            == 0
        )
        [row] = json.loads(capsys.readouterr().out)
        # the host named ran, not the one the policy trained on
        assert row["host_params"] == host_params(host, blocks) != host_params("toy-mlp", 3)
        assert row["steps"] == 3 and 0.0 <= row["test_accuracy"] <= 1.0
    # the checkpoint records its layout; code of another layout refuses it in one line naming what differs
    module_dir = resolve_checkpoint(run) / MODULE_PATH
    assert saved_layout(module_dir) == policy_layout()
    monkeypatch.setattr(layout, "MAX_SLOTS", 4)
    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", str(run), "--episodes", "1"])
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert f"its policy layout does not match this code's: max_slots {MAX_SLOTS} there, 4 here" in line


# ----------------------------------------------------------------------------- blueprints a host does not offer
@pytest.mark.parametrize("choose", ["greedy", "sampled"])
def test_a_blueprint_the_host_lacks_is_never_planted_even_by_a_policy_that_prefers_it(choose):
    """A policy whose blueprint head all but insists on the CNN blueprints (as one trained on digits would), and whose
    op head prefers GERMINATE, acts on a vector host: every seed it plants is one the host offers. The mask, not the
    policy, keeps them out: the same logits unmasked pick conv_heavy."""
    import torch

    from esper_ray.policy.rl_module import MODEL_PRESETS, MorphoPolicyModule
    from esper_ray.train.commands.evaluate import GreedyPolicyController

    env = toy_env("any-mlp-4", 4, max_epochs=12, commit_horizon=False)
    offered = {b.key for b in env.blueprints}
    cnn_only = {b.key for b in topology_blueprints("cnn")} - offered
    assert "conv_heavy" in cnn_only
    torch.manual_seed(0)
    module = MorphoPolicyModule(
        observation_space=env.observation_space,
        action_space=gym.spaces.MultiDiscrete(env.action_space.nvec),
        model_config=dict(MODEL_PRESETS["cpu"], max_seq_len=13),
    )
    nvec = [int(n) for n in env.action_space.nvec]
    with torch.no_grad():
        joint_bias, blueprint_bias = module.policy_heads[0][2].bias, module.policy_heads[1][2].bias
        joint_bias[[encode_joint(Op.GERMINATE, i) for i in range(MAX_SLOTS)]] = 8.0
        blueprint_bias[[int(Blueprint[k.upper()]) for k in cnn_only]] = 30.0
        blueprint_bias[int(Blueprint.CONV_HEAVY)] = 40.0
    filter_ = filter_for(env.observation_space)
    controller = GreedyPolicyController(module, filter_)
    if choose == "sampled":
        controller.choose = lambda dist: dist.sample()
    planted = {}
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        controller.reset()
        terminated = False
        while not terminated:
            obs, _, terminated, _, info = env.step(controller.act(obs))  # a masked action would raise
        for key, n in info.items():
            if key.startswith("count/germinated/") and n:
                planted[key.removeprefix("count/germinated/")] = (
                    planted.get(key.removeprefix("count/germinated/"), 0) + n
                )
    assert planted and set(planted) <= offered, planted
    unmasked = torch.cat([h(torch.zeros(1, module.cell)) for h in module.policy_heads], dim=-1)
    assert int(torch.split(unmasked, nvec, dim=-1)[1].argmax()) == int(Blueprint.CONV_HEAVY)
