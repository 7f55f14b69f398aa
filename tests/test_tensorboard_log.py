"""What `esper-ray train` writes to TensorBoard: the user's figures first under named groups that fit TensorBoard's
first page, with their units in their names, RLlib's after them, its config never as charts, the settings once as
text; perplexity for text tasks only and the network's size as it grows."""

from __future__ import annotations

import math
from typing import Any

import pytest

from esper_ray.contracts import metrics as m
from esper_ray.contracts.actions import HEAD_NAMES, Blueprint, Op
from esper_ray.contracts.controllers import FixedSeed
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env import MorphogeneticEnv
from esper_ray.policy.baselines import wait_action
from esper_ray.policy.fixed import FixedSeedController
from esper_ray.train.output.round_summary import flatten_numbers
from esper_ray.train.output.tensorboard_log import (
    DETAIL_GROUP,
    NAMED,
    PAGE_SIZE,
    log_config,
    log_round,
    tensorboard_scalars,
)
from esper_ray.train.rllib.callbacks import MorphoMetrics
from esper_ray.train.rllib.learner import ENTROPY_PREFIX

USER_GROUPS = ("host", "ppo", "ppo_entropy", "seeds", "seeds_kept", "seeds_planted", "speed")


def rllib_result() -> dict:
    """A round's result shaped like RLlib 2.60's (a few of its ~240 figures), with its config riding along."""
    return {
        "training_iteration": 3,
        "time_this_iter_s": 4.0,
        "timestamp": 1.7e9,
        "config": {"_disable_execution_plan_api": -1, "lr": 3e-4, "model": {"fcnet_hiddens": [64]}, "env": "morpho"},
        m.ENV_RUNNERS: {
            m.ENV_STEPS_SAMPLED: 24,
            m.FINAL_ACCURACY: 0.81,
            m.FINAL_ACCURACY_MIN: 0.7,
            m.FINAL_ACCURACY_MAX: 0.9,
            m.EPISODE_RETURN: 1.5,
            m.SEEDS_FOSSILIZED: 0.5,
            m.SEEDS_GERMINATED: 1.0,
            m.SEEDS_PRUNED: 0.25,
            m.PARAMS_ADDED: 729.0,
            m.HOST_PARAMS: 6400.0,
            m.FINAL_PARAMS: 7129.0,
            m.OP_COUNT_PREFIX + "wait": 20.0,
            m.PHASE_TIME_PREFIX + "train": 0.12,
            m.FINAL_PERPLEXITY: math.nan,
            "episode_len_mean": 6.0,
            m.BLUEPRINT_COUNT_PREFIX + "germinated_conv_heavy": 0.75,
            m.BLUEPRINT_COUNT_PREFIX + "fossilized_conv_heavy": 0.5,
        },
        m.LEARNERS: {
            m.DEFAULT_MODULE: {
                "entropy_op_slot": 1.2,
                "entropy_blueprint": 0.9,
                "entropy": 2.0,
                "approx_kl": 0.01,
                "value_explained_variance": 0.3,
                "vf_explained_var": 0.1,
                "policy_loss": -0.02,
                "vf_loss": 0.4,
                "num_trainable_parameters": 5000,
            }
        },
        "timers": {"training_step": 3.9},
    }


def test_named_figures_land_in_their_groups_with_their_values():
    scalars = tensorboard_scalars(rllib_result())
    assert scalars["host/final_accuracy"] == 0.81 and scalars["host/final_accuracy_min"] == 0.7
    assert scalars["host/final_params"] == 7129.0 and scalars["host/initial_params"] == 6400.0  # grown, and as born
    assert scalars["seeds/fossilized_per_episode"] == 0.5 and scalars["seeds/params_added_per_episode"] == 729.0
    assert scalars["seeds/op_wait_per_episode"] == 20.0
    assert (
        scalars["seeds_planted/conv_heavy_per_episode"] == 0.75 and scalars["seeds_kept/conv_heavy_per_episode"] == 0.5
    )
    assert scalars["ppo/episode_return"] == 1.5 and scalars["ppo/approx_kl"] == 0.01
    assert scalars["ppo/loss_policy"] == -0.02 and scalars["ppo/loss_value"] == 0.4
    assert (
        scalars["ppo_entropy/op_slot"] == 1.2
        and scalars["ppo_entropy/blueprint"] == 0.9
        and scalars["ppo/entropy"] == 2.0
    )
    assert scalars["ppo/explained_variance"] == 0.3
    assert scalars["speed/env_steps_per_second"] == 24 / 4.0 and scalars["speed/seconds_per_round"] == 4.0
    assert scalars["speed/seconds_per_episode_train"] == 0.12


def test_config_is_never_a_chart_and_every_other_figure_is_charted_once():
    result = rllib_result()
    scalars = tensorboard_scalars(result)
    assert not any("config" in tag or "_disable_execution_plan_api" in tag for tag in scalars)
    finite = {
        k: v for k, v in flatten_numbers({k: v for k, v in result.items() if k != "config"}).items() if math.isfinite(v)
    }
    derived = {"speed/env_steps_per_second"}
    assert len(scalars) == len(finite) + len(derived)  # each finite figure once, renamed or not
    assert sorted(v for t, v in scalars.items() if t not in derived) == sorted(finite.values())
    assert "host/final_perplexity" not in scalars  # NaN (a round without a finished episode): no point at all
    assert scalars[f"{DETAIL_GROUP}/{m.ENV_RUNNERS}/episode_len_mean"] == 6.0


def test_user_groups_come_before_rllibs_own_figures_in_tensorboards_order():
    groups = sorted({tag.split("/", 1)[0] for tag in tensorboard_scalars(rllib_result())})
    assert groups == sorted(USER_GROUPS) + [DETAIL_GROUP]  # TensorBoard orders groups by name


class RecordingWriter:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []
        self.texts: list[tuple[str, str, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.texts.append((tag, text, step))


def test_a_run_logs_its_settings_once_as_text_and_each_round_at_its_number():
    writer = RecordingWriter()
    cfg = TrainConfig(rounds=7, reward_mode="sparse")
    log_config(writer, cfg, 0)
    for round_ in (1, 2):
        log_round(writer, rllib_result(), round_)
    assert len(writer.texts) == 1 and writer.texts[0][0] == "config"
    assert '"reward_mode": "sparse"' in writer.texts[0][1] and '"rounds": 7' in writer.texts[0][1]
    per_round = len(tensorboard_scalars(rllib_result()))
    assert [step for _, _, step in writer.scalars] == [1] * per_round + [2] * per_round


# ----------------------------------------------------------- every figure a real round has, and what an episode logs
class EpisodeChunk:
    """The two methods of RLlib's SingleAgentEpisode that MorphoMetrics reads."""

    def __init__(self, infos: list[dict[str, Any]], rewards: list[float]) -> None:
        self.infos, self.rewards = infos, rewards

    def get_infos(self) -> list[dict[str, Any]]:
        return self.infos

    def get_return(self) -> float:
        return sum(self.rewards)


class RecordingMetricsLogger:
    """MetricsLogger.log_value, reduced as RLlib reduces a round with one episode: every value is that episode's."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def log_value(self, key: str, value: float, reduce: str) -> None:
        assert reduce in ("mean", "min", "max", "sum"), (key, reduce)
        self.values[key] = float(value)


def logged_episode(env: MorphogeneticEnv, act: Any) -> dict[str, float]:
    """Run one episode of `env` with `act(obs)` and return what MorphoMetrics logs for it, by metric key."""
    obs, info = env.reset(seed=0)
    infos, rewards, done = [info], [], False
    while not done:
        obs, reward, done, _, info = env.step(act(obs))
        infos.append(info)
        rewards.append(reward)
    logger = RecordingMetricsLogger()
    MorphoMetrics().on_episode_end(episode=EpisodeChunk(infos, rewards), metrics_logger=logger)
    return logger.values


def round_result(runners: dict[str, float]) -> dict[str, Any]:
    """A round's result holding these env-runner figures, every PPO figure the named groups show, and one entropy
    per action head."""
    learner = {path.split("/")[-1]: 0.5 for path in NAMED if path.startswith(f"{m.LEARNERS}/")}
    learner.update({ENTROPY_PREFIX + head: 1.0 for head in HEAD_NAMES})
    return {
        "time_this_iter_s": 2.0,
        m.ENV_RUNNERS: {**runners, m.ENV_STEPS_SAMPLED: 8},
        m.LEARNERS: {m.DEFAULT_MODULE: learner},
    }


SEED = FixedSeed(Blueprint.CONV_HEAVY, "r0c1")


@pytest.fixture(scope="module")
def fossilizing_episode() -> tuple[MorphogeneticEnv, dict[str, float]]:
    """digits-impaired with a conv_heavy seed planted in r0c1 at step 1 and fossilized at the first legal epoch
    (no epochs of TRAINING required, so at step 7 of 8)."""
    env = MorphogeneticEnv(
        {"task": "digits-impaired", "max_epochs": 8, "device": "cpu", "batch_size": 1024, "min_training_epochs": 0}
    )
    controller = FixedSeedController(env.slot_ids, 8, SEED, min_training_epochs=0)
    controller.reset()
    return env, logged_episode(env, controller.act)


def test_host_params_grow_with_a_fossilized_seed(fossilizing_episode):
    env, logged = fossilizing_episode
    assert logged[m.SEEDS_FOSSILIZED] == 1
    seed = 18 * 4 * 4 + 4 * 4  # conv_heavy at C = 4 channels: 18C^2 + 4C (DOMAIN.md)
    scalars = tensorboard_scalars(round_result(logged))
    assert scalars["host/initial_params"] == env.model.host_params == 160  # the host alone, as every episode starts
    assert scalars["host/final_params"] == 160 + seed  # what the run keeps: the host and its fossil
    assert (
        scalars["host/final_params_with_probation"] == 160 + seed and scalars["seeds/params_added_per_episode"] == seed
    )


def test_perplexity_is_charted_for_text_tasks_only(fossilizing_episode):
    _, digits = fossilizing_episode
    assert m.FINAL_PERPLEXITY not in digits  # exp(cross-entropy) of a classifier is no perplexity
    assert "host/final_perplexity" not in tensorboard_scalars(round_result(digits))
    text_env = MorphogeneticEnv({"task": "text", "text_max_bytes": 20_000, "max_epochs": 1, "device": "cpu"})
    text = logged_episode(text_env, lambda obs: wait_action())
    assert text[m.FINAL_PERPLEXITY] == pytest.approx(math.exp(text_env.val.loss()))  # per token
    assert tensorboard_scalars(round_result(text))["host/final_perplexity"] == text[m.FINAL_PERPLEXITY]


def test_every_figure_of_a_round_is_named_with_its_unit_and_each_group_fits_tensorboards_first_page(
    fossilizing_episode,
):
    _, logged = fossilizing_episode
    scalars = tensorboard_scalars(round_result(logged))
    groups: dict[str, list[str]] = {}
    for tag in scalars:
        group, name = tag.split("/", 1)
        groups.setdefault(group, []).append(name)
    # every figure an episode logs is named, but the episode count (RLlib has its own beside it)
    assert sorted(groups) == sorted(USER_GROUPS) + [DETAIL_GROUP]
    assert sorted(groups.pop(DETAIL_GROUP)) == sorted(f"{m.ENV_RUNNERS}/{k}" for k in (m.EPISODES, m.ENV_STEPS_SAMPLED))
    for group, names in groups.items():
        assert len(names) <= PAGE_SIZE, (
            f"{group}/ has {len(names)} charts; TensorBoard pages after {PAGE_SIZE}: {sorted(names)}"
        )
    assert {"loss_policy", "loss_value", "loss_total", "episode_return"} <= set(groups["ppo"])
    assert all(name.endswith("_per_episode") for name in groups["seeds"])  # counts of one unit, not per round
    assert sorted(f"op_{op.name.lower()}_per_episode" for op in Op) == sorted(
        n for n in groups["seeds"] if n.startswith("op_")
    )
    assert (
        sum(scalars[f"seeds/op_{op.name.lower()}_per_episode"] for op in Op) == 8
    )  # decisions of the one 8-step episode
    # times and rates, and the captures that cost the first steps of each new structure their time
    assert all(
        name.startswith("seconds_per_") or name.endswith("_per_second") or name == "graph_captures_per_episode"
        for name in groups["speed"]
    )
