"""The heuristic controller and `esper-ray heuristic`."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from esper_ray.cli import main
from esper_ray.contracts.actions import Blueprint, Op, decode_joint, topology_blueprints
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.observation import (
    BASE_VAL_ACCURACY,
    SLOT_EPOCHS_IN_STAGE,
    EpochView,
    blueprint_ids,
    build_features,
    slot_offset,
)
from esper_ray.policy.heuristic import DEFAULT_ROTATION, HeuristicConfig, HeuristicController
from esper_ray.train.commands.heuristic import run_heuristic
from tests.morpho_helpers import drive_to

AS_GIVEN = HeuristicConfig(reference_epochs=None)
"""The original's numbers, unscaled (the rules themselves are under test)."""


def test_a_heuristic_run_too_short_for_a_seeds_lifecycle_runs_the_host_alone_to_its_last_epoch():
    """A seed takes 16 steps from germination to the first it can be fossilized at (STANDARD tempo), so in a 12-epoch
    run the heuristic plants none, whatever the host's numbers: each episode is the host's own 12 epochs."""
    summaries = run_heuristic({"task": "digits", "max_epochs": 12, "num_shards": 2}, episodes=2, progress=False)
    assert [s.episode for s in summaries] == [0, 1]
    for s in summaries:
        assert s.steps == 12 and not s.rolled_back and s.refused == 0
        assert s.germinated == s.params_added == s.seed_train_flops == 0
        assert s.final_accuracy == s.final_accuracy_with_probation


def flat_run_observation(
    env: MorphogeneticEnv, epoch: int, losses: list[float], accuracies: list[float], max_epochs: int = 40
) -> dict:
    """The observation of an epoch with this loss/accuracy history (the host's own numbers, no training needed)."""
    view = EpochView(
        epoch=epoch,
        max_epochs=max_epochs,
        val_loss=losses[-1],
        val_accuracy=accuracies[-1],
        loss_history=losses,
        accuracy_history=accuracies,
        last_action_success=True,
        last_op=Op.WAIT,
    )
    slots = env.model.seed_slots()
    return {
        "features": build_features(view, slots, env.slot_descriptors),
        "blueprint_ids": blueprint_ids(slots),
        "action_mask": env._mask(),
    }


def test_heuristic_germinates_only_after_the_host_has_stabilised_and_plateaued():
    """A constructed run (any machine gives the same numbers): the loss falls fast for 3 epochs, then stays within
    1 % while the accuracy stops rising. Stabilised after 3 flat epochs, plateaued after 3, epoch >= 5: germinate."""
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 40, "num_shards": 6})
    env.reset(seed=0)
    controller = HeuristicController(env.slot_ids, 40, AS_GIVEN)
    losses = [2.3, 1.7, 1.3, 1.0, 0.995, 0.99, 0.99, 0.985, 0.985]
    accuracies = [0.10, 0.40, 0.55, 0.62, 0.621, 0.622, 0.621, 0.623, 0.622]
    decisions = []
    for epoch in range(len(losses)):
        obs = flat_run_observation(env, epoch, losses[: epoch + 1], accuracies[: epoch + 1])
        action = controller.act(obs)
        decisions.append((decode_joint(int(action[0])), Blueprint(int(action[1]))))
    ops = [op for (op, _), _ in decisions]
    assert ops[:6] == [Op.WAIT] * 6  # still falling, then not yet 3 flat epochs of both signals
    first = ops.index(Op.GERMINATE)
    assert first == 6 and decisions[first] == (
        (Op.GERMINATE, 0),
        Blueprint.CONV_LIGHT,
    )  # first slot, first of the rotation


@pytest.mark.parametrize(("topology", "germinates"), [("cnn", False), ("transformer", True)])
def test_a_language_models_slow_climb_counts_as_a_plateau_on_a_transformer_only(topology, germinates):
    """A constructed run: the loss falls by 1.5 % and the accuracy rises by 0.8 pp every epoch, as a byte-level
    language model's do for dozens of epochs. On a transformer that is a plateau (threshold 1 pp per token); on
    a CNN it is progress (0.5 pp), so the heuristic keeps waiting."""
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 40, "num_shards": 6})
    env.reset(seed=0)
    controller = HeuristicController(
        env.slot_ids, 40, HeuristicConfig(rotation=(Blueprint.NORM,), reference_epochs=None), topology=topology
    )
    losses = [2.0 * 0.985**e for e in range(9)]
    accuracies = [0.30 + 0.008 * e for e in range(9)]
    ops = [
        decode_joint(int(controller.act(flat_run_observation(env, e, losses[: e + 1], accuracies[: e + 1]))[0]))[0]
        for e in range(9)
    ]
    assert (Op.GERMINATE in ops) is germinates, ops
    if germinates:
        assert ops.index(Op.GERMINATE) == 5  # epoch >= 5, with 3 stable and 3 plateau epochs behind it


def _holding_env(contribution: float) -> tuple[MorphogeneticEnv, HeuristicController]:
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 40, "num_shards": 6, "auto_forward": False})
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
    assert decode_joint(int(action[0])) == (expected, 1)


def test_heuristic_numbers_scale_with_the_run_and_it_plants_nothing_that_cannot_finish_its_lifecycle():
    """The original's numbers are for 75-epoch runs; a 25-epoch run has a third of the epochs, so epoch counts shrink
    by 3 and per-epoch thresholds grow by 3. A seed planted on the observation of epoch e is germinated at step
    e + 1 and can be fossilized 16 steps later at the soonest, so the last epoch it plants at is 25 - 16 - 1 = 8."""
    cfg = HeuristicController(["r0c0", "r0c1"], 25).cfg
    assert (cfg.min_epoch, cfg.stable_epochs, cfg.plateau_epochs, cfg.embargo_epochs, cfg.prune_patience) == (
        2,
        1,
        1,
        2,
        2,
    )
    assert cfg.stable_band == pytest.approx((-0.15, 0.09)) and cfg.plateau_threshold == pytest.approx(0.015)
    assert HeuristicController(["r0c0"], 75).cfg.min_epoch == 5  # the original's own run length: unchanged
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 25, "num_shards": 6})
    env.reset(seed=0)
    flat = [1.0] * 30, [0.5] * 30  # stabilised and flat from the start: it would plant at any epoch it may
    for epoch, plants in ((8, True), (9, False), (20, False)):
        controller = HeuristicController(env.slot_ids, 25)
        ops = [
            decode_joint(int(controller.act(flat_run_observation(env, e, flat[0][: e + 1], flat[1][: e + 1], 25))[0]))[
                0
            ]
            for e in range(epoch - 2, epoch + 1)
        ]
        assert (ops[-1] is Op.GERMINATE) is plants, (epoch, ops)


@pytest.mark.parametrize(("max_epochs", "plants"), [(19, True), (18, False)])
def test_heuristic_plants_at_the_last_step_whose_seed_the_env_can_still_fossilize(max_epochs, plants):
    """The env's gates are the oracle for the planting deadline. Told to plant as soon as it may (epoch 2, step 3),
    the heuristic does so in a 19-epoch run, and the env lets that seed be fossilized at step 3 + 16 = 19, the last
    one; in an 18-epoch run the same seed could not be, so it plants nothing (and no other epoch is later legal)."""
    env = MorphogeneticEnv(
        {"task": "digits-impaired", "max_epochs": max_epochs, "device": "cpu", "batch_size": 1024, "seed": 3}
    )
    eager = HeuristicConfig(
        reference_epochs=None,
        min_epoch=2,
        plateau_threshold=1.0,
        plateau_epochs=1,
        stable_epochs=1,
        stable_band=(-1.0, 1.0),
        fossilize_contribution=-1.0,
        prune_drop=1.0,
        ransomware_contribution=1.0,
    )  # nothing pruned: any seed that reaches HOLDING is kept
    assert eager.lifecycle_epochs == 16
    controller = HeuristicController(env.slot_ids, max_epochs, eager)
    obs, _ = env.reset(seed=0)
    germinated_at = []
    for step in range(1, max_epochs + 1):
        action = controller.act(obs)
        if decode_joint(int(action[0]))[0] is Op.GERMINATE:
            germinated_at.append(step)
        obs, _, terminated, _, info = env.step(action)
        if terminated:
            break
    if plants:
        assert germinated_at == [3] and info["count/fossilized"] == 1, (germinated_at, info["stages"])
    else:
        assert germinated_at == [] and info["count/germinated"] == 0


@pytest.mark.parametrize(
    ("epochs_in_stage", "accuracy_change", "expected"),
    [
        (7, -0.03, Op.PRUNE),  # 7 epochs in TRAINING (the patience here) and 3 pp lost since it began: pruned
        (7, -0.01, Op.ADVANCE),  # 1 pp lost: within prune_drop (2 pp); advanced, as any TRAINING seed the rule spares
        (6, -0.03, Op.ADVANCE),  # 3 pp lost, one epoch short of the patience (the env would let it go: age 6 >= 5)
    ],
)
def test_heuristic_prunes_a_training_seed_that_cost_accuracy_only_after_its_patience(
    epochs_in_stage, accuracy_change, expected
):
    """Issue 30 (a baseline that never ends a seed's lifecycle is a second `none`): the rule's other exit, by a
    constructed observation (any machine gives the same numbers)."""
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 40, "num_shards": 6, "auto_forward": False})
    env.reset(seed=0)
    slot = env.model.slot("r0c1")
    drive_to(slot, Stage.TRAINING)
    for _ in range(epochs_in_stage):
        slot.step_epoch()
    controller = HeuristicController(env.slot_ids, 40, dataclasses.replace(AS_GIVEN, prune_patience=7))
    obs = env._observation()
    assert round(float(obs["features"][slot_offset(1) + SLOT_EPOCHS_IN_STAGE]) * 40) == epochs_in_stage
    accuracy = float(obs["features"][BASE_VAL_ACCURACY])
    controller.t.slots[1].stage = Stage.TRAINING  # seen in TRAINING since the accuracy was this much higher
    controller.t.slots[1].accuracy_at_stage_start = accuracy - accuracy_change
    assert decode_joint(int(controller.act(obs)[0])) == (expected, 1)


def test_heuristic_rotation_must_fit_the_host_topology():
    with pytest.raises(ValueError, match=r"rotation: \['lora'\] are not cnn blueprints"):
        HeuristicController(["r0c0"], 10, HeuristicConfig(rotation=(Blueprint.CONV_LIGHT, Blueprint.LORA)))
    with pytest.raises(ValueError, match=r"rotation: \['conv_light'\] are not transformer blueprints"):
        HeuristicController(["r0c0"], 10, HeuristicConfig(rotation=(Blueprint.CONV_LIGHT,)), topology="transformer")
    # On a transformer the default rotation starts with the original's (CNN) rotation less what a transformer cannot
    # take, in its order, so the one lifecycle a short run has goes to attention.
    fits = topology_blueprints("transformer")
    original_order = [b for b in DEFAULT_ROTATION if b in fits]
    rotation = HeuristicController(["r0c0"], 10, topology="transformer").rotation
    assert list(rotation[: len(original_order)]) == original_order and rotation[0] is Blueprint.ATTENTION


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


def test_the_heuristic_command_prints_each_episodes_test_accuracy_as_eval_does(capsys):
    """`eval --help` says its output compares with `heuristic`'s: both measure the held-out test split."""
    assert main(["heuristic", "--task", "digits", "--max-epochs", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    [summary] = json.loads(out)
    assert 0 < summary["test_accuracy"] <= 1
    assert f"test acc {100 * summary['test_accuracy']:.1f}%" in err.splitlines()[-1]  # the episode's progress line
    assert main(["heuristic", "--task", "digits", "--max-epochs", "2"]) == 0
    assert re.search(r"^episode 0: final acc [0-9.]+% \(start [0-9.]+%\), test acc [0-9.]+%", capsys.readouterr().out)


def test_the_heuristic_command_and_the_ab_heuristic_arm_run_the_same_env_settings(monkeypatch):
    """`esper-ray heuristic` takes TRAINING_ENV_DEFAULTS (commit_horizon on) as train, eval and every A/B arm do,
    and a flag still turns a setting off."""
    import esper_ray.train.commands.heuristic as heuristic_command
    from esper_ray.contracts.env_config import EnvConfig
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.commands.evaluate import evaluation_episodes

    given: list[dict] = []
    monkeypatch.setattr(heuristic_command, "run_heuristic", lambda config, *a, **k: given.append(dict(config)) or [])
    assert main(["heuristic"]) == 0 and main(["heuristic", "--no-commit-horizon"]) == 0
    arm = evaluation_episodes(TrainConfig(envs=1), 1)[0].env_config  # the A/B heuristic arm's env, one shard
    assert (
        EnvConfig.from_mapping(given[0]) == EnvConfig.from_mapping(arm) and EnvConfig.from_mapping(arm).commit_horizon
    )
    assert not EnvConfig.from_mapping(given[1]).commit_horizon


def test_the_heuristic_command_warns_in_one_line_when_its_runs_are_too_short_to_keep_a_seed(capsys):
    assert main(["heuristic", "--max-epochs", "3", "--batch-size", "1024"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert (
        len(warnings) == 1
        and warnings[0].startswith("esper-ray heuristic: warning: no seed can be kept in a run of max_epochs=3")
        and "max_epochs >= 15" in warnings[0]
    )


def test_the_heuristics_planting_deadline_follows_the_envs_lifecycle():
    """A run whose min_training_epochs is lowered gives a seed's lifecycle fewer steps: the heuristic's deadline (the
    A/B arm's and the command's) takes the env's, not the default's 16."""
    from esper_ray.contracts.controllers import ControllerKind
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.commands.evaluate import baseline_controller
    from esper_ray.train.commands.heuristic import PerMemberHeuristic

    arm = baseline_controller(ControllerKind.HEURISTIC, TrainConfig(env={"min_training_epochs": 4}))
    assert arm.cfg.lifecycle_epochs == 4 + 5 + 1  # TRAINING, the standard tempo's 5-epoch blend, one in HOLDING
    env = MorphogeneticEnv({"task": "digits-impaired", "device": "cpu", "min_training_epochs": 4, "batch_size": 1024})
    assert PerMemberHeuristic(env).inner.cfg.lifecycle_epochs == 4 + 5 + 1
    assert baseline_controller(ControllerKind.HEURISTIC, TrainConfig()).cfg.lifecycle_epochs == 16
