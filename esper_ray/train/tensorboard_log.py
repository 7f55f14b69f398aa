"""What `esper-ray train` writes to TensorBoard: the figures a user came for first, under four named groups, then
RLlib's own figures in one group after them, and the run's settings once, as text.

    host/     the grown host: final accuracy (mean, min, max), accuracy at the start, perplexity, size, rollbacks
    ppo/      the controller: episode return, entropy of each action head, approximate KL, explained variance,
              losses, learning rate, entropy coefficient
    seeds/    what the controller did: seeds germinated, fossilized and pruned, parameters they added, op counts
    speed/    env steps per second, seconds per round, where an env step's time goes
    z_rllib/  everything else RLlib reports (about 100 figures), by its own names

TensorBoard orders groups by name, hence `z_rllib`. RLlib's result also carries its whole config, about 100
constants that charted as flat lines, one per round; those are left out, and the esper-ray settings that made
the run are logged once as text (`config`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from esper_ray.contracts import metrics as m
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.learner import APPROX_KL_KEY, ENTROPY_PREFIX, EXPLAINED_VARIANCE_KEY, REWARD_STD_KEY
from esper_ray.train.round_summary import flatten_numbers

DETAIL_GROUP = "z_rllib"
CONFIG_TAG = "config"
LEFT_OUT = ("config",)
"""Top-level result keys that are not figures of the round (RLlib's config: constants)."""

_RUNNERS = m.ENV_RUNNERS + "/"
_LEARNER = f"{m.LEARNERS}/{m.DEFAULT_MODULE}/"
NAMED: dict[str, str] = {
    _RUNNERS + m.FINAL_ACCURACY: "host/final_accuracy",
    _RUNNERS + m.FINAL_ACCURACY_MIN: "host/final_accuracy_min",
    _RUNNERS + m.FINAL_ACCURACY_MAX: "host/final_accuracy_max",
    _RUNNERS + m.FINAL_ACCURACY_WITH_PROBATION: "host/final_accuracy_with_probation",
    _RUNNERS + m.INITIAL_ACCURACY: "host/initial_accuracy",
    _RUNNERS + m.FINAL_PERPLEXITY: "host/final_perplexity",
    _RUNNERS + m.HOST_PARAMS: "host/params",
    _RUNNERS + m.ROLLBACKS: "host/rollbacks",
    _RUNNERS + m.EPISODE_RETURN: "ppo/episode_return",
    _LEARNER + APPROX_KL_KEY: "ppo/approx_kl",
    _LEARNER + EXPLAINED_VARIANCE_KEY: "ppo/explained_variance",
    _LEARNER + "entropy": "ppo/entropy",
    _LEARNER + "policy_loss": "ppo/policy_loss",
    _LEARNER + "vf_loss": "ppo/value_loss",
    _LEARNER + "total_loss": "ppo/total_loss",
    _LEARNER + "curr_entropy_coeff": "ppo/entropy_coeff",
    _LEARNER + "default_optimizer_learning_rate": "ppo/learning_rate",
    _LEARNER + REWARD_STD_KEY: "ppo/reward_std",
    _RUNNERS + m.SEEDS_GERMINATED: "seeds/germinated",
    _RUNNERS + m.SEEDS_FOSSILIZED: "seeds/fossilized",
    _RUNNERS + m.SEEDS_PRUNED: "seeds/pruned",
    _RUNNERS + m.PARAMS_ADDED: "seeds/params_added",
    _RUNNERS + m.PARAMS_ON_PROBATION: "seeds/params_on_probation",
    "time_this_iter_s": "speed/seconds_per_round",
}
"""Result path -> tag, for the figures with fixed names."""
NAMED_PREFIXES: dict[str, str] = {
    _LEARNER + ENTROPY_PREFIX: "ppo/entropy_",        # one per action head
    _RUNNERS + m.OP_COUNT_PREFIX: "seeds/op_",        # decisions per episode, by op
    _RUNNERS + m.PHASE_TIME_PREFIX: "speed/time_",    # seconds per env step, by phase
}
STEPS_PER_SECOND_TAG = "speed/env_steps_per_second"


class ScalarWriter(Protocol):
    def add_scalar(self, tag: str, value: float, step: int) -> Any: ...

    def add_text(self, tag: str, text: str, step: int) -> Any: ...


def tensorboard_scalars(result: dict[str, Any]) -> dict[str, float]:
    """{tag: value} for one round's RLlib result: named figures under host/, ppo/, seeds/ and speed/, every other
    numeric figure under z_rllib/ by its own path, RLlib's config left out, and nothing that is not finite
    (a mean over no episodes this round, say)."""
    out: dict[str, float] = {}
    for path, value in flatten_numbers({k: v for k, v in result.items() if k not in LEFT_OUT}).items():
        if not math.isfinite(value):
            continue
        out[_tag_of(path)] = value
    steps = out.get(f"{DETAIL_GROUP}/{_RUNNERS}{m.ENV_STEPS_SAMPLED}")
    seconds = out.get(NAMED["time_this_iter_s"])
    if steps is not None and seconds:
        out[STEPS_PER_SECOND_TAG] = steps / seconds
    return out


def _tag_of(path: str) -> str:
    if path in NAMED:
        return NAMED[path]
    for prefix, group in NAMED_PREFIXES.items():
        if path.startswith(prefix):
            return group + path[len(prefix):]
    return f"{DETAIL_GROUP}/{path}"


def log_round(writer: ScalarWriter, result: dict[str, Any], round_: int) -> None:
    for tag, value in tensorboard_scalars(result).items():
        writer.add_scalar(tag, value, round_)


def log_config(writer: ScalarWriter, cfg: TrainConfig, round_: int) -> None:
    """The run's settings, once per command (a resume logs them again at the round it starts from)."""
    text = json.dumps(cfg.to_dict(), indent=2)
    writer.add_text(CONFIG_TAG, "    " + text.replace("\n", "\n    "), round_)  # indented: TensorBoard shows it as code
