"""What `esper-ray train` writes to TensorBoard: the user's figures first under named groups, RLlib's after them,
its config never as charts, and the settings once as text."""

from __future__ import annotations

import math

from esper_ray.contracts import metrics as m
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.round_summary import flatten_numbers
from esper_ray.train.tensorboard_log import DETAIL_GROUP, log_config, log_round, tensorboard_scalars

USER_GROUPS = ("host", "ppo", "seeds", "speed")


def rllib_result() -> dict:
    """A round's result shaped like RLlib 2.60's (a few of its ~240 figures), with its config riding along."""
    return {
        "training_iteration": 3, "time_this_iter_s": 4.0, "timestamp": 1.7e9,
        "config": {"_disable_execution_plan_api": -1, "lr": 3e-4, "model": {"fcnet_hiddens": [64]}, "env": "morpho"},
        m.ENV_RUNNERS: {
            m.ENV_STEPS_SAMPLED: 24, m.FINAL_ACCURACY: 0.81, m.FINAL_ACCURACY_MIN: 0.7, m.FINAL_ACCURACY_MAX: 0.9,
            m.EPISODE_RETURN: 1.5, m.SEEDS_FOSSILIZED: 0.5, m.SEEDS_GERMINATED: 1.0, m.SEEDS_PRUNED: 0.25,
            m.PARAMS_ADDED: 729.0, m.HOST_PARAMS: 6400.0, m.OP_COUNT_PREFIX + "wait": 20.0,
            m.PHASE_TIME_PREFIX + "train": 0.12, m.FINAL_PERPLEXITY: math.nan, "episode_len_mean": 6.0,
        },
        m.LEARNERS: {m.DEFAULT_MODULE: {
            "entropy_op_slot": 1.2, "entropy_blueprint": 0.9, "entropy": 2.0, "approx_kl": 0.01,
            "value_explained_variance": 0.3, "vf_explained_var": 0.1, "policy_loss": -0.02, "num_trainable_parameters": 5000,
        }},
        "timers": {"training_step": 3.9},
    }


def test_named_figures_land_in_their_groups_with_their_values():
    scalars = tensorboard_scalars(rllib_result())
    assert scalars["host/final_accuracy"] == 0.81 and scalars["host/final_accuracy_min"] == 0.7
    assert scalars["host/params"] == 6400.0
    assert scalars["seeds/fossilized"] == 0.5 and scalars["seeds/params_added"] == 729.0 and scalars["seeds/op_wait"] == 20.0
    assert scalars["ppo/episode_return"] == 1.5 and scalars["ppo/approx_kl"] == 0.01
    assert scalars["ppo/entropy_op_slot"] == 1.2 and scalars["ppo/entropy_blueprint"] == 0.9 and scalars["ppo/entropy"] == 2.0
    assert scalars["ppo/explained_variance"] == 0.3
    assert scalars["speed/env_steps_per_second"] == 24 / 4.0 and scalars["speed/seconds_per_round"] == 4.0
    assert scalars["speed/time_train"] == 0.12


def test_config_is_never_a_chart_and_every_other_figure_is_charted_once():
    result = rllib_result()
    scalars = tensorboard_scalars(result)
    assert not any("config" in tag or "_disable_execution_plan_api" in tag for tag in scalars)
    finite = {k: v for k, v in flatten_numbers({k: v for k, v in result.items() if k != "config"}).items() if math.isfinite(v)}
    derived = {"speed/env_steps_per_second"}
    assert len(scalars) == len(finite) + len(derived)  # each finite figure once, renamed or not
    assert sorted(v for t, v in scalars.items() if t not in derived) == sorted(finite.values())
    assert "host/final_perplexity" not in scalars  # NaN (a task without perplexity): no point at all
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
