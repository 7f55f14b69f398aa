"""Controllers that are not learned: `none` (always WAIT) and `random` (uniform over legal actions).

They read the same observation and mask as the policy, so any A/B comparison can include them as baselines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from esper_ray.contracts.actions import (
    HEAD_NAMES,
    AlphaCurve,
    AlphaSpeed,
    AlphaTarget,
    Blueprint,
    BlueprintId,
    Op,
    Style,
    Tempo,
    encode_joint,
)
from esper_ray.env.masks import action_nvec, head_offsets


def wait_action() -> np.ndarray:
    """WAIT with every other head at index 0 (WAIT reads no other head)."""
    action = np.zeros(len(action_nvec()), dtype=np.int64)
    action[0] = encode_joint(Op.WAIT, None)
    return action


def lifecycle_action(
    op: Op,
    slot_index: int | None,
    *,
    blueprint: BlueprintId = Blueprint.CONV_LIGHT,
    style: Style = Style.SIGMOID_ADD,
    tempo: Tempo = Tempo.STANDARD,
    alpha_target: AlphaTarget = AlphaTarget.FULL,
) -> np.ndarray:
    """One action of a rule-based controller: the heads GERMINATE reads as given, the others at their defaults
    (a prune is instant, a retarget linear)."""
    return np.array(
        [
            encode_joint(op, slot_index),
            int(blueprint),
            int(style),
            int(tempo),
            int(alpha_target),
            int(AlphaSpeed.INSTANT),
            int(AlphaCurve.LINEAR),
        ],
        dtype=np.int64,
    )


class NoGrowthController:
    """Always WAIT: the host trains as it is."""

    def __init__(self, slot_ids: Sequence[str]) -> None:
        pass

    def reset(self) -> None:
        pass

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        return wait_action()


class RandomController:
    """Each head uniform over its legal values (the joint op/slot head over the legal (op, slot) pairs)."""

    def __init__(self, slot_ids: Sequence[str], seed: int) -> None:
        self.offsets = head_offsets()
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass  # the generator runs on across episodes: each episode gets other draws, reproducibly

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        mask = obs["action_mask"]
        action = np.zeros(len(HEAD_NAMES), dtype=np.int64)
        for i, name in enumerate(HEAD_NAMES):
            legal = np.flatnonzero(mask[self.offsets[name]])
            if len(legal) == 0:
                raise ValueError(f"action mask leaves no legal value for head {name}")
            action[i] = self.rng.choice(legal)
        return action
