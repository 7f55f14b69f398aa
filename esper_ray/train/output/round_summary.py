"""One training round's figures, read out of RLlib's result dict, and the progress line that shows them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from esper_ray.contracts import metrics as m
from esper_ray.formatting import counted, largest_share
from esper_ray.train.rllib.step_failures import failures_text, round_failures


@dataclass(frozen=True)
class RoundSummary:
    round: int
    env_steps: int
    env_steps_lifetime: int
    episodes: int
    episode_return: float
    final_accuracy: float
    final_accuracy_min: float
    final_accuracy_max: float
    """final_accuracy*: the committed model's (host and fossils), what each host run keeps."""
    final_accuracy_with_probation: float
    """The mean final accuracy with the seeds still on probation in."""
    params_added: float
    """Parameters of the fossilized seeds at episode end (mean)."""
    host_params: float
    germinated: float
    fossilized: float
    pruned: float
    rollbacks: int
    failed_env_steps: int
    """Env steps that raised this round (each lost its episode)."""
    failed_env_steps_lifetime: int
    env_step_errors: str
    """This round's distinct errors, type and first line, with their counts ("" if none)."""
    steps_per_second: float
    seconds: float
    by_blueprint: dict[str, float] = field(default_factory=dict)
    """Seeds per episode by outcome and blueprint, {"germinated_attention": 0.4, "fossilized_attention": 0.1, ...}:
    what the policy plants and keeps (empty where no episode ended this round)."""
    by_member: dict[str, float] = field(default_factory=dict)
    """With a family (TrainConfig.family): each member's episodes this round and their mean final accuracy,
    {"impaired_episodes": 2, "impaired_final_accuracy": 0.31, ...} (members with no episode ended are absent)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(group: dict[str, Any], key: str, default: float = math.nan) -> float:
    """A metric that RLlib omits until the first episode ends (and this round may have none)."""
    value = group[key] if key in group else default
    return float(value)


def _count(group: dict[str, Any], key: str) -> int:
    """A summed count: absent before it is first logged, NaN in a round where nothing was logged under it."""
    value = _number(group, key, 0)
    return int(value) if math.isfinite(value) else 0


def summarize_round(result: dict[str, Any]) -> RoundSummary:
    runners = result[m.ENV_RUNNERS] if m.ENV_RUNNERS in result else {}
    seconds = float(result["time_this_iter_s"])
    steps = _count(runners, m.ENV_STEPS_SAMPLED)
    return RoundSummary(
        round=int(result["training_iteration"]),
        env_steps=steps,
        env_steps_lifetime=int(result["num_env_steps_sampled_lifetime"]),
        episodes=_count(runners, m.EPISODES),
        episode_return=_number(runners, m.EPISODE_RETURN),
        final_accuracy=_number(runners, m.FINAL_ACCURACY),
        final_accuracy_min=_number(runners, m.FINAL_ACCURACY_MIN),
        final_accuracy_max=_number(runners, m.FINAL_ACCURACY_MAX),
        final_accuracy_with_probation=_number(runners, m.FINAL_ACCURACY_WITH_PROBATION),
        params_added=_number(runners, m.PARAMS_ADDED),
        host_params=_number(runners, m.HOST_PARAMS),
        germinated=_number(runners, m.SEEDS_GERMINATED),
        fossilized=_number(runners, m.SEEDS_FOSSILIZED),
        pruned=_number(runners, m.SEEDS_PRUNED),
        rollbacks=_count(runners, m.ROLLBACKS),
        failed_env_steps=_count(runners, m.ENV_STEP_FAILURES_ROUND),
        failed_env_steps_lifetime=_count(runners, m.ENV_STEP_FAILURES),
        env_step_errors=failures_text(round_failures(result)),
        steps_per_second=steps / seconds if seconds > 0 else math.nan,
        seconds=seconds,
        by_blueprint={
            key.removeprefix(m.BLUEPRINT_COUNT_PREFIX): float(value)
            for key, value in sorted(runners.items())
            if key.startswith(m.BLUEPRINT_COUNT_PREFIX)
        },
        by_member={
            key.removeprefix(m.FAMILY_PREFIX): float(value)
            for key, value in sorted(runners.items())
            if key.startswith(m.FAMILY_PREFIX) and math.isfinite(float(value))
        },
    )


def planted_most(s: RoundSummary) -> tuple[str, float] | None:
    """The blueprint germinated most in the round and its share of the germinations."""
    prefix = "germinated_"
    return largest_share({k.removeprefix(prefix): v for k, v in s.by_blueprint.items() if k.startswith(prefix)})


def progress_line(s: RoundSummary, total_rounds: int) -> str:
    line = (
        f"round {s.round}/{total_rounds} | env steps {s.env_steps} ({counted(s.episodes, 'episode')}) | "
        f"return {s.episode_return:.2f} | final acc {100 * s.final_accuracy:.1f}% "
        f"(min {100 * s.final_accuracy_min:.1f}, max {100 * s.final_accuracy_max:.1f}; "
        f"{100 * s.final_accuracy_with_probation:.1f}% with probation) | "
        f"params kept +{s.params_added:,.0f} | seeds/ep germ {s.germinated:.1f} foss {s.fossilized:.1f} "
        f"prune {s.pruned:.1f} | {s.steps_per_second:.1f} steps/s | {s.seconds:.1f}s"
    )
    if s.rollbacks:
        line += f" | rollbacks {s.rollbacks}"
    if s.failed_env_steps:
        line += f" | FAILED env steps {s.failed_env_steps} (episodes lost): {s.env_step_errors}"
    return line


def flatten_numbers(tree: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every numeric leaf of a nested result dict, keyed by its slash-joined path (for TensorBoard)."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten_numbers(value, path))
        elif isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
            out[path] = float(value)
    return out
