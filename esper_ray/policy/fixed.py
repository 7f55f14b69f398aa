"""The `fixed` controller: one named seed, planted at the first step and fossilized as early as allowed (or
several, one after the other: FixedPlanController).

It answers "would a host born with this seed do as well?": the seed goes through the same lifecycle as any
other (GERMINATED, 10 epochs of isolated TRAINING, a blend-in ramp, HOLDING), so it costs the same compute per
stage as a grown one, and is kept at the first epoch the FOSSILIZE op is legal. Then the controller waits.

Like the heuristic it reads only the observation and the mask. Where the env's gates refuse an action (G5
finds no counterfactual yet, or exploding seed gradients; G2/G3 when auto-forward is off), it retries on the
next epoch; the env counts each refused action (`count/refused`), and the report shows them per arm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from esper_ray.contracts.actions import AlphaTarget, Op
from esper_ray.contracts.controllers import FixedPlan, FixedSeed
from esper_ray.contracts.stages import Stage
from esper_ray.env.masks import allows
from esper_ray.env.observation import SLOT_ALPHA, SLOT_EPOCHS_IN_STAGE, SLOT_FEATURES, decode_stage, slot_offset
from esper_ray.policy.baselines import lifecycle_action, wait_action


class FixedSeedController:
    """Germinate `seed` when its slot is empty, advance it where auto-forward is off, fossilize it from HOLDING."""

    def __init__(self, slot_ids: Sequence[str], max_epochs: int, seed: FixedSeed, min_training_epochs: int) -> None:
        if seed.slot not in slot_ids:
            raise ValueError(f"fixed seed slot={seed.slot!r}: not an enabled slot; enabled slots: {list(slot_ids)}")
        self.slot_ids = list(slot_ids)
        self.index = self.slot_ids.index(seed.slot)
        self.seed = seed
        self.max_epochs = max_epochs
        self.min_training_epochs = min_training_epochs

    def reset(self) -> None:
        pass  # everything it needs is in the observation

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        block = obs["features"][slot_offset(self.index) : slot_offset(self.index) + SLOT_FEATURES]
        op = self._wanted(decode_stage(block), block)
        if op is None or not allows(obs["action_mask"], op, self.index, self.seed.tempo):
            return wait_action()
        return lifecycle_action(
            op,
            self.index,
            blueprint=self.seed.blueprint,
            style=self.seed.style,
            tempo=self.seed.tempo,
            alpha_target=AlphaTarget.FULL,
        )

    def _wanted(self, stage: Stage, block: np.ndarray) -> Op | None:
        if stage is Stage.DORMANT:
            return Op.GERMINATE
        if stage is Stage.GERMINATED:
            return Op.ADVANCE
        if stage is Stage.TRAINING:  # G2 refuses before this many epochs in TRAINING: no point asking sooner
            epochs_in_stage = round(float(block[SLOT_EPOCHS_IN_STAGE]) * self.max_epochs)
            return Op.ADVANCE if epochs_in_stage >= self.min_training_epochs else None
        if stage is Stage.BLENDING:  # G3 refuses until the ramp has settled at alpha 1.0
            return Op.ADVANCE if float(block[SLOT_ALPHA]) >= 1.0 else None
        if stage is Stage.HOLDING:
            return Op.FOSSILIZE
        return None


class FixedPlanController:
    """A FixedPlan: each seed driven by its own FixedSeedController, in the plan's order; at each step the first
    that does not wait acts. The env's mask orders the germinations: the next seed's GERMINATE is refused while
    an earlier one is GERMINATED or TRAINING, so it goes in at the first step after that."""

    def __init__(self, slot_ids: Sequence[str], max_epochs: int, plan: FixedPlan, min_training_epochs: int) -> None:
        self.controllers = [FixedSeedController(slot_ids, max_epochs, seed, min_training_epochs) for seed in plan.seeds]

    def reset(self) -> None:
        for controller in self.controllers:
            controller.reset()

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        return first_acting(self.controllers, obs)


def first_acting(controllers: Sequence[FixedSeedController], obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The action of the first controller that does not wait; every one is asked, so each keeps its own count."""
    waiting = wait_action()
    actions = [controller.act(obs) for controller in controllers]
    return next((a for a in actions if not np.array_equal(a, waiting)), waiting)
