"""The language-model path through the env: token counts, perplexity, topology masks, a germinating heuristic
episode, pair interactions in the observation, and `esper-ray train --task text`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from esper_ray.cli import main
from esper_ray.contracts.actions import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS, Blueprint, Op, encode_joint
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.masks import head_offsets
from esper_ray.env.observation import SLOT_FEATURES, slot_offset
from esper_ray.morpho.counterfactual import build_plan
from esper_ray.morpho.transformer_blueprints import AttentionSeed
from esper_ray.policy.baselines import wait_action
from esper_ray.policy.heuristic import HeuristicConfig, HeuristicController
from esper_ray.train.commands.episodes import run_episode
from tests.morpho_helpers import drive_to

SMALL_TEXT = {"task": "text", "text_max_bytes": 30_000, "max_epochs": 4, "device": "cpu"}


def test_text_counts_tokens_and_reports_perplexity():
    env = MorphogeneticEnv({**SMALL_TEXT, "num_shards": 3, "shard": 1})
    _, info = env.reset(seed=0)
    _, _, _, _, info = env.step(wait_action())
    sequences = len(env.shard)
    assert (
        info["train_total"] == sequences * 64 and info["val_total"] == env.data.val_y.numel()
    )  # tokens, not sequences
    assert info["train_batches"] == -(-sequences // env.cfg.effective_batch_size)
    assert info["val_perplexity"] == pytest.approx(math.exp(info["val_loss"]))
    assert 0 < info["val_loss"] < math.log(256) + 0.5 and env.random_guess_loss == pytest.approx(math.log(256))


def test_blueprint_masks_follow_the_host_topology():
    text, image = MorphogeneticEnv(SMALL_TEXT), MorphogeneticEnv({"task": "digits", "max_epochs": 3})
    for env, allowed in (
        (text, set(TRANSFORMER_BLUEPRINTS) - {Blueprint.FLEX_ATTENTION}),
        (image, set(CNN_BLUEPRINTS)),
    ):
        obs, _ = env.reset(seed=0)
        legal = {Blueprint(i) for i in np.flatnonzero(obs["action_mask"][head_offsets()["blueprint"]])}
        assert legal == allowed  # flex_attention: no CPU backward in this torch, so masked with its reason
    action = wait_action()
    action[0], action[1] = encode_joint(Op.GERMINATE, 0), int(Blueprint.CONV_LIGHT)
    with pytest.raises(ValueError, match="masked action: head blueprint"):
        text.step(action)
    action[1] = int(Blueprint.LORA)
    with pytest.raises(ValueError, match="masked action: head blueprint"):
        image.step(action)


def test_a_heuristic_episode_on_text_germinates_a_transformer_seed():
    env = MorphogeneticEnv({**SMALL_TEXT, "max_epochs": 12})
    # plateau_threshold 1.0: every epoch counts as a plateau, so the host only has to settle (loss within -5 %); the
    # numbers as given and no deadline (a 12-epoch run is too short for a seed's whole lifecycle)
    controller = HeuristicController(
        env.slot_ids,
        12,
        HeuristicConfig(min_epoch=2, plateau_threshold=1.0, stable_epochs=1, reference_epochs=None, lifecycle_epochs=0),
        topology="transformer",
    )
    summary = run_episode(env, controller, 0)
    assert summary.germinated >= 1 and summary.params_added + summary.params_on_probation > 0
    assert isinstance(env.model.slot("r0c0").seed, AttentionSeed)  # the transformer rotation starts with attention


def test_pair_interactions_reach_the_observation():
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 6, "num_shards": 4, "auto_forward": False})
    env.reset(seed=0)
    for slot_id in ("r0c0", "r0c1"):
        drive_to(env.model.slot(slot_id), Stage.HOLDING)  # germinates conv_light and walks it to HOLDING
    obs, _, _, _, _ = env.step(wait_action())
    plan = build_plan(env.model)
    assert plan.pairs == (("r0c0", "r0c1"),)
    a, b = env.model.slot("r0c0").metrics, env.model.slot("r0c1").metrics
    assert a.interaction_sum == b.interaction_sum != 0.0  # I_ab is symmetric, and real for two live conv seeds
    column = 22  # 23rd per-slot feature: interaction_sum / 10 in pp, clamped to [-1, 1]
    for i, metrics in enumerate((a, b)):
        assert obs["features"][slot_offset(i) + column] == pytest.approx(
            max(min(10 * metrics.interaction_sum, 1), -1), abs=1e-6
        )
    assert SLOT_FEATURES == 31


@pytest.mark.expensive
def test_train_and_heuristic_commands_run_on_text(ray_local, tmp_path, capsys):
    assert main(["heuristic", "--task", "text", "--text-max-bytes", "30000", "--max-epochs", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["steps"] == 2 and 0 <= rows[0]["final_accuracy"] <= 1
    out = tmp_path / "text"
    assert (
        main(
            [
                "train",
                "--task",
                "text",
                "--rounds",
                "2",
                "--envs",
                "2",
                "--cpus-per-env",
                "0.5",
                "--max-epochs",
                "3",
                "--episodes-per-env",
                "1",
                "--env",
                "text_max_bytes=30000",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and all(
        r["env_steps"] == 6 and r["failed_env_steps"] == 0 for r in rounds
    )
