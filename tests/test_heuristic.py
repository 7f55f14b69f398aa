"""The heuristic controller and `esper-ray heuristic`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from esper_ray.cli import main
from esper_ray.contracts.actions import Blueprint, Op, decode_joint
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv
from esper_ray.policy.heuristic import HeuristicConfig, HeuristicController
from esper_ray.train.heuristic import run_heuristic
from tests.morpho_helpers import drive_to


def test_heuristic_on_digits_ends_far_above_the_untrained_host():
    summaries = run_heuristic({"task": "digits", "max_epochs": 12, "num_shards": 2}, episodes=2, progress=False)
    for s in summaries:
        assert s.steps == 12 and not s.terminated
        assert s.final_accuracy > s.initial_accuracy + 0.5 and s.final_accuracy > 0.85


def test_heuristic_grows_and_fossilizes_a_seed_on_the_starved_host():
    summaries = run_heuristic({"task": "digits-impaired", "max_epochs": 45}, episodes=2, progress=False)
    assert sum(s.germinated for s in summaries) >= 1
    assert sum(s.fossilized for s in summaries) >= 1 and any(s.params_added > 0 for s in summaries)


def _holding_env(contribution: float) -> tuple[MorphogeneticEnv, HeuristicController]:
    env = MorphogeneticEnv({"max_epochs": 40, "num_shards": 6, "auto_forward": False})
    env.reset(seed=0)
    controller = HeuristicController(env.slot_ids, 40)
    slot = env.model.slot("r0c1")
    slot.observe_accuracy(0.5)
    drive_to(slot, Stage.HOLDING)
    slot.observe_accuracy(0.6)
    slot.metrics.record_contribution(contribution)
    return env, controller


@pytest.mark.parametrize("contribution, expected", [(0.02, Op.FOSSILIZE), (0.002, Op.PRUNE)])
def test_heuristic_fossilizes_a_contributing_holding_seed_and_prunes_a_useless_one(contribution, expected):
    env, controller = _holding_env(contribution)
    obs = env._observation()
    controller.t.slots[1].stage = Stage.HOLDING  # seen holding, accuracy up 5 pp since germination
    controller.t.slots[1].accuracy_at_germination = env.val.accuracy() - 0.05
    action = controller.act(obs)
    assert decode_joint(int(action[0]), 3) == (expected, 1)


def test_heuristic_rotation_rejects_non_cnn_blueprints():
    with pytest.raises(ValueError, match=r"rotation: \['lora'\] are not CNN blueprints"):
        HeuristicConfig(rotation=(Blueprint.CONV_LIGHT, Blueprint.LORA))


def test_heuristic_cli_prints_each_episode_as_json(capsys):
    assert main(["heuristic", "--task", "digits", "--episodes", "2", "--max-epochs", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["episode"] for r in rows] == [0, 1]
    assert {"final_accuracy", "params_added", "germinated", "fossilized", "pruned"} <= set(rows[0])
    assert all(0.0 <= r["final_accuracy"] <= 1.0 and np.isfinite(r["episode_return"]) for r in rows)


def test_heuristic_cli_rejects_bad_settings_with_one_clear_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["heuristic", "--max-epochs", "0"])
    assert exit_info.value.code == 2
    assert "max_epochs=0: must be an integer >= 1" in capsys.readouterr().err
