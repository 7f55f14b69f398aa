"""A blueprint a plug-in registers under a name of its own (issue 75): offered, planted, trained, saved and rebuilt by
name, its costs in the observation, and a finite logit from the slot policy. No Ray.

The plug-in (tests/blueprint_parts.py) registers `dilated` for every CNN host, so each test puts the registry back
as it found it: the other test files see the built-in CNN blueprints only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from torch.utils.flop_counter import FlopCounterMode

from esper_ray.contracts import registry
from esper_ray.contracts.actions import MAX_BLUEPRINTS, MAX_SLOTS, Blueprint, PluginBlueprint, blueprint_id
from esper_ray.contracts.controllers import FixedSeed
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.env.blueprint_costs import relative_cost
from esper_ray.env.masks import head_offsets
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.morpho.grown import grown_from
from esper_ray.morpho.grown_artifact import ARCHITECTURE_FILE, load_grown, save_grown_network
from esper_ray.morpho.hosts import build_host
from esper_ray.policy.baselines import wait_action
from esper_ray.policy.fixed import FixedSeedController
from esper_ray.policy.rl_module import MASKED_LOGIT
from esper_ray.policy.slot_distribution import slot_joint_size
from esper_ray.policy.slot_module import SLOT_MODEL_PRESETS, SlotPolicyModule, slot_spaces
from tests.blueprint_parts import PLUGIN, DilatedSeed
from tests.morpho_helpers import drive_to, make_model, perturbed_for_eval

ENV = {"task": "digits", "plugins": [PLUGIN], "device": "cpu", "max_epochs": 4}


def _snapshot() -> tuple[dict, list, set]:
    return dict(registry._BLUEPRINTS), list(registry._VOCABULARY), set(registry._LOADED)


def _restore(saved: tuple[dict, list, set]) -> None:
    registry._BLUEPRINTS.clear()
    registry._BLUEPRINTS.update(saved[0])
    registry._VOCABULARY[:] = saved[1]
    registry._LOADED.clear()
    registry._LOADED.update(saved[2])


@pytest.fixture
def dilated():
    """`dilated` registered by its plug-in, as a run's `plugins` loads it; the registry put back afterwards."""
    saved = _snapshot()
    registry.load_plugins([PLUGIN])
    yield blueprint_id("dilated")
    _restore(saved)


def counted(module: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(parameters, forward FLOPs) counted here, apart from the code under test."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        module.eval()(x)
    return sum(p.numel() for p in module.parameters()), counter.get_total_flops()


def test_a_plugin_blueprint_under_a_new_name_takes_the_next_free_vocabulary_entry(dilated):
    assert dilated == PluginBlueprint("dilated") and dilated.key == "dilated"
    assert len(Blueprint) <= int(dilated) < MAX_BLUEPRINTS
    assert registry.blueprint_vocabulary()[int(dilated)] == "dilated"
    assert [b.key for b in Blueprint][1:] == list(registry.blueprint_vocabulary()[1 : len(Blueprint)])  # fixed


def test_a_plugin_blueprint_under_a_new_name_is_offered_planted_by_a_fixed_plan_and_trains(dilated):
    env = MorphogeneticEnv(ENV)
    obs, _ = env.reset(seed=0)
    index = int(dilated)
    assert dilated in env.blueprints and obs["action_mask"][head_offsets()["blueprint"]][index] == 1
    seed = FixedSeed.from_mapping({"blueprint": "dilated", "slot": "r0c1"}, "fixed", topology="cnn", slots=env.slot_ids)
    assert seed.blueprint == dilated and seed.to_dict()["blueprint"] == "dilated"
    controller = FixedSeedController(env.slot_ids, 4, seed, LifecycleConfig().min_training_epochs)
    action = controller.act(obs)
    assert int(action[1]) == index  # the action names it by its vocabulary index
    obs, *_ = env.step(action)
    slot = env.model.slot("r0c1")
    assert slot.blueprint == dilated and isinstance(slot.seed, DilatedSeed) and slot.stage is Stage.TRAINING
    assert obs["blueprint_ids"][env.slot_ids.index("r0c1")] == index
    assert env.counts["germinated/dilated"] == 1
    before = [p.detach().clone() for p in slot.seed.parameters()]
    *_, info = env.step(wait_action())
    assert info["flops/train_seeds"] > 0  # its FLOPs are counted (measured: morpho/flops.py seed_cost)
    assert any(not torch.equal(a, p) for a, p in zip(before, slot.seed.parameters()))  # it trains


def test_a_grown_network_records_a_plugin_blueprint_by_name_and_load_grown_rebuilds_it(dilated, tmp_path):
    model = make_model(["r0c0", "r0c1"], auto_forward=False)
    drive_to(model.slot("r0c1"), Stage.FOSSILIZED, blueprint="dilated")
    model = perturbed_for_eval(model)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        network = grown_from(model)
        want = network(x)
    save_grown_network(tmp_path / "net", network, {})
    seeds = json.loads((tmp_path / "net" / ARCHITECTURE_FILE).read_text())["seeds"]
    assert [(s["slot"], s["blueprint"]) for s in seeds] == [("r0c1", "dilated")]
    _restore(_snapshot_without_dilated())  # a fresh process: the plug-in not imported
    with pytest.raises(ValueError, match="dilated"):
        load_grown(tmp_path / "net")
    loaded = load_grown(tmp_path / "net", plugins=[PLUGIN])
    assert isinstance(loaded.seeds["r0c1"].seed, DilatedSeed) and loaded.seed_specs[0].blueprint == dilated
    with torch.no_grad():
        assert torch.equal(loaded(x), want)


def _snapshot_without_dilated() -> tuple[dict, list, set]:
    blueprints, vocabulary, loaded = _snapshot()
    return (
        {k: v for k, v in blueprints.items() if k[1] != "dilated"},
        [n for n in vocabulary if n != "dilated"],
        loaded - {PLUGIN},
    )


def test_the_costs_of_a_plugin_blueprint_in_the_observation_are_its_counted_parameters_and_flops(dilated):
    env = MorphogeneticEnv(ENV)
    obs, _ = env.reset(seed=0)
    costs, index = obs["blueprint_costs"], int(dilated)
    assert costs.shape == (MAX_SLOTS, MAX_BLUEPRINTS, 2) and env.observation_space["blueprint_costs"].contains(costs)
    host = build_host("digits")
    host_params, host_flops = counted(host, host.example_input())
    for i, slot in enumerate(env.slot_ids):
        shape = tuple(host.slot_shape(slot))
        params, flops = counted(DilatedSeed(shape[0]), torch.zeros(1, *shape))
        want = [relative_cost(params, host_params), relative_cost(flops, host_flops)]
        np.testing.assert_allclose(costs[i, index], want, rtol=1e-5)
        assert min(want) > 0.5  # a 3x3 convolution at the slot's width: about as big as the small digits host
        assert costs[i, int(Blueprint.CONV_HEAVY)][0] > costs[i, int(Blueprint.NORM)][0] > 0  # built-ins counted too
    offered = obs["action_mask"][head_offsets()["blueprint"]] == 1
    assert not costs[:, ~offered].any() and not costs[len(env.slot_ids) :].any()  # not offered, absent: 0


def test_the_slot_policy_gives_a_plugin_blueprint_a_finite_unmasked_logit(dilated):
    env = MorphogeneticEnv(ENV)
    obs, _ = env.reset(seed=0)
    observation_space, action_space = slot_spaces(MAX_SLOTS)
    assert observation_space == env.observation_space  # the env's own spaces
    module = SlotPolicyModule(
        observation_space=observation_space,
        action_space=action_space,
        model_config=dict(SLOT_MODEL_PRESETS["cpu"], max_seq_len=4),
    )
    batch = {
        Columns.OBS: {k: torch.as_tensor(v)[None, None] for k, v in obs.items()},
        Columns.STATE_IN: {k: torch.as_tensor(v)[None] for k, v in module.get_initial_state().items()},
    }
    with torch.no_grad():
        logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0, 0]
    rows = logits[slot_joint_size(MAX_SLOTS) :].view(MAX_SLOTS, -1)[: len(env.slot_ids), :MAX_BLUEPRINTS]
    assert torch.isfinite(rows[:, int(dilated)]).all() and (rows[:, int(dilated)] > MASKED_LOGIT / 2).all()
    probability = torch.softmax(rows, -1)[:, int(dilated)]
    assert (probability > 0.01).all()  # near-uniform over the 8 offered at initialisation


def test_a_blueprint_name_already_registered_and_one_past_the_vocabulary_are_refused_in_one_line(dilated):
    with pytest.raises(ValueError, match=r"^blueprint \('cnn', 'dilated'\) is registered already"):
        registry.register_blueprint("dilated", "cnn", lambda c, m: torch.nn.Identity())
    with pytest.raises(ValueError, match="^blueprint name 'noop': reserved"):
        registry.register_blueprint("noop", "cnn", lambda c, m: torch.nn.Identity())
    registry.register_blueprint("dilated", "vector", lambda c, m: torch.nn.Identity())  # another topology: one entry
    free = MAX_BLUEPRINTS - len(registry.blueprint_vocabulary())
    for k in range(free):
        registry.register_blueprint(f"extra{k}", "vector", lambda c, m: torch.nn.Identity())
    assert len(registry.blueprint_vocabulary()) == MAX_BLUEPRINTS
    with pytest.raises(ValueError) as err:
        registry.register_blueprint("one_more", "vector", lambda c, m: torch.nn.Identity())
    assert str(err.value).startswith(
        f"blueprint name 'one_more': the policy's blueprint vocabulary is full (MAX_BLUEPRINTS={MAX_BLUEPRINTS} "
    )
    assert "\n" not in str(err.value)
    registry.register_blueprint("mlp", "cnn", lambda c, m: torch.nn.Identity())  # a name already used: no new entry
