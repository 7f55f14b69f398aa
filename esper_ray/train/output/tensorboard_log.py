"""What `esper-ray train` writes to TensorBoard: the figures a user came for first, under seven named groups, then
RLlib's own figures in one group after them, and the run's settings once, as text.

    host/         the grown network at the end of each episode: accuracy of what the run keeps (mean, min, max, and
                  with the seeds on probation), its size in parameters (`final_params`, against `initial_params`,
                  the host alone), perplexity (text tasks only), accuracy at the start, rollbacks per round
    ppo/          the controller: episode return, losses, entropy, approximate KL, explained variance, learning rate,
                  entropy coefficient, reward std
    ppo_entropy/  the entropy of each action head
    seeds/        what the controller did, per episode: seeds germinated, fossilized and pruned, parameters they
                  added and left on probation, decisions by op
    seeds_kept/   seeds fossilized per episode, by blueprint (`conv_heavy_per_episode`): which seed the policy keeps
    seeds_planted/  seeds germinated per episode, by blueprint: which seed the policy plants, round by round
    speed/        env steps per second, seconds per round, and per episode in each phase of the env step
    z_rllib/      everything else RLlib reports (about 100 figures), by its own names

Every name says its unit where it is a count or a time: `_per_episode` (a mean over the round's episodes),
`_per_round`, `seconds_per_`. TensorBoard orders groups by name, hence `z_rllib`, and tags within a group by name,
showing 12 a page (its default page size): each user group holds at most 12, so the PPO losses are on the first
screen. RLlib's result also carries its whole config, about 100 constants that charted as flat lines, one per
round; those are left out, and the esper-ray settings that made the run are logged once as text (`config`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from esper_ray.contracts import metrics as m
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.output.round_summary import flatten_numbers
from esper_ray.train.rllib.learner import APPROX_KL_KEY, ENTROPY_PREFIX, EXPLAINED_VARIANCE_KEY, REWARD_STD_KEY

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
    _RUNNERS + m.FINAL_PARAMS: "host/final_params",
    _RUNNERS + m.FINAL_PARAMS_WITH_PROBATION: "host/final_params_with_probation",
    _RUNNERS + m.FINAL_PERPLEXITY: "host/final_perplexity",
    _RUNNERS + m.INITIAL_ACCURACY: "host/initial_accuracy",
    _RUNNERS + m.HOST_PARAMS: "host/initial_params",
    _RUNNERS + m.ROLLBACKS: "host/rollbacks_per_round",
    _RUNNERS + m.EPISODE_RETURN: "ppo/episode_return",
    _LEARNER + APPROX_KL_KEY: "ppo/approx_kl",
    _LEARNER + EXPLAINED_VARIANCE_KEY: "ppo/explained_variance",
    _LEARNER + "entropy": "ppo/entropy",
    _LEARNER + "policy_loss": "ppo/loss_policy",
    _LEARNER + "vf_loss": "ppo/loss_value",
    _LEARNER + "total_loss": "ppo/loss_total",
    _LEARNER + "curr_entropy_coeff": "ppo/entropy_coeff",
    _LEARNER + "default_optimizer_learning_rate": "ppo/learning_rate",
    _LEARNER + REWARD_STD_KEY: "ppo/reward_std",
    _RUNNERS + m.SEEDS_GERMINATED: "seeds/germinated_per_episode",
    _RUNNERS + m.SEEDS_FOSSILIZED: "seeds/fossilized_per_episode",
    _RUNNERS + m.SEEDS_PRUNED: "seeds/pruned_per_episode",
    _RUNNERS + m.PARAMS_ADDED: "seeds/params_added_per_episode",
    _RUNNERS + m.PARAMS_ON_PROBATION: "seeds/params_on_probation_per_episode",
    _RUNNERS + m.SEED_EPOCHS: "seeds/epochs_with_a_seed_per_episode",
    _RUNNERS + m.GRAPH_CAPTURES: "speed/graph_captures_per_episode",
    "time_this_iter_s": "speed/seconds_per_round",
}
"""Result path -> tag, for the figures with fixed names."""
NAMED_PREFIXES: dict[str, tuple[str, str]] = {
    _LEARNER + ENTROPY_PREFIX: ("ppo_entropy/", ""),  # one per action head
    _RUNNERS + m.OP_COUNT_PREFIX: ("seeds/op_", "_per_episode"),  # decisions per episode, by op
    _RUNNERS + m.BLUEPRINT_COUNT_PREFIX + "germinated_": ("seeds_planted/", "_per_episode"),  # by blueprint
    _RUNNERS + m.BLUEPRINT_COUNT_PREFIX + "fossilized_": ("seeds_kept/", "_per_episode"),
    _RUNNERS + m.PHASE_TIME_PREFIX: ("speed/seconds_per_episode_", ""),  # by phase of the env step
}
"""Result path prefix -> (tag prefix, tag suffix), for the figures of one kind: the rest of the path goes between."""
PAGE_SIZE = 12
"""Charts TensorBoard shows on a group's first page (its default `pageSize` setting)."""
STEPS_PER_SECOND_TAG = "speed/env_steps_per_second"


class ScalarWriter(Protocol):
    def add_scalar(self, tag: str, value: float, step: int) -> Any: ...

    def add_text(self, tag: str, text: str, step: int) -> Any: ...


def tensorboard_scalars(result: dict[str, Any]) -> dict[str, float]:
    """{tag: value} for one round's RLlib result: named figures under host/, ppo/, ppo_entropy/, seeds/ and speed/,
    every other numeric figure under z_rllib/ by its own path, RLlib's config left out, and nothing that is not
    finite (a mean over no episodes this round, say)."""
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
    for prefix, (before, after) in NAMED_PREFIXES.items():
        if path.startswith(prefix):
            return before + path[len(prefix) :] + after
    return f"{DETAIL_GROUP}/{path}"


def log_round(writer: ScalarWriter, result: dict[str, Any], round_: int) -> None:
    for tag, value in tensorboard_scalars(result).items():
        writer.add_scalar(tag, value, round_)


def log_config(writer: ScalarWriter, cfg: TrainConfig, round_: int) -> None:
    """The run's settings, once per command (a resume logs them again at the round it starts from)."""
    text = json.dumps(cfg.to_dict(), indent=2)
    writer.add_text(CONFIG_TAG, "    " + text.replace("\n", "\n    "), round_)  # indented: TensorBoard shows it as code
