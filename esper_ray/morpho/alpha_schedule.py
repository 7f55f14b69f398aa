"""Per-slot alpha amplitude schedule (DOMAIN.md section 2): HOLD at a value, or ramp UP/DOWN to a target.

One `step()` per epoch. A ramp of n steps follows its curve and lands exactly on the target at step n.
A new target may only be set while holding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

from esper_ray.contracts.actions import SIGMOID_STEEPNESS, AlphaCurve


class AlphaMode(IntEnum):
    HOLD = 0
    UP = 1
    DOWN = 2


def curve_progress(curve: AlphaCurve, t: float) -> float:
    """Fraction of the way to the target after fraction `t` in [0, 1] of the ramp; 0 -> 0 and 1 -> 1."""
    t = min(max(t, 0.0), 1.0)
    if curve is AlphaCurve.LINEAR:
        return t
    if curve is AlphaCurve.COSINE:
        return 0.5 * (1.0 - math.cos(math.pi * t))
    k = SIGMOID_STEEPNESS[curve]

    def logistic(z: float) -> float:
        return 1.0 / (1.0 + math.exp(-z))

    low, high = logistic(-k / 2), logistic(k / 2)
    return (logistic(k * (t - 0.5)) - low) / (high - low)


@dataclass
class AlphaSchedule:
    alpha: float = 0.0
    target: float = 0.0
    mode: AlphaMode = AlphaMode.HOLD
    curve: AlphaCurve = AlphaCurve.LINEAR
    start: float = 0.0
    steps_total: int = 0
    steps_done: int = 0

    @property
    def holding(self) -> bool:
        return self.mode is AlphaMode.HOLD

    @property
    def steps_left(self) -> int:
        return self.steps_total - self.steps_done

    def retarget(self, target: float, steps: int, curve: AlphaCurve) -> None:
        """Start a ramp from the current alpha to `target` over `steps` epochs (0 = jump now)."""
        if not self.holding:
            raise RuntimeError(
                f"alpha ramp to {self.target} still running ({self.steps_left} steps left); retarget only from HOLD"
            )
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"alpha target {target} must be in [0, 1]")
        self.start, self.target, self.curve = self.alpha, float(target), curve
        self.steps_total, self.steps_done = int(steps), 0
        if steps <= 0 or target == self.alpha:
            self.alpha, self.mode = self.target, AlphaMode.HOLD
        else:
            self.mode = AlphaMode.UP if target > self.alpha else AlphaMode.DOWN

    def step(self) -> None:
        if self.holding:
            return
        self.steps_done += 1
        if self.steps_done >= self.steps_total:
            self.alpha, self.mode = self.target, AlphaMode.HOLD
            return
        progress = curve_progress(self.curve, self.steps_done / self.steps_total)
        self.alpha = self.start + (self.target - self.start) * progress
