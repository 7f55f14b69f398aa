"""The loss family (shaped mode only): reward a falling validation loss.

The original's function expected loss_delta = val_loss - prev (negative = better) but its trainer passed
prev - val_loss, so the sign was suspect (DOMAIN.md section 8). Here the delta is computed in one place,
`val_loss - prev_val_loss`, and a falling loss gives a positive reward (tested).
"""

from __future__ import annotations

import math

from esper_ray.contracts.rewards import RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.rewards import components as rc

MAX_SIGMAS = 5.0
REGRESSION_WEIGHT = 0.5
MAX_RENT = 5.0


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    delta = signal.val_loss - signal.prev_val_loss  # negative = better
    scaled = min(max(delta / cfg.loss_sigma, -MAX_SIGMAS), MAX_SIGMAS)
    if scaled > 0:
        scaled *= REGRESSION_WEIGHT  # a regression is punished half as hard as an equal gain is paid
    grown = sum(
        s.seed_params for s in signal.slots if s.stage_after in rc.RENT_STAGES and s.age >= cfg.loss_rent_grace_epochs
    )
    rent = -cfg.loss_rent_weight * min(math.log1p(grown / max(signal.host_params, 1)), MAX_RENT)
    terminal = 0.0
    if signal.is_terminal:
        span = signal.random_guess_loss - cfg.loss_target
        terminal = min(max((signal.random_guess_loss - signal.val_loss) / span, 0.0), 1.0)
    return breakdown(
        {
            "loss_delta": -5.0 * scaled,
            "pbrs": rc.pbrs(signal, cfg, weight=0.1),
            "rent": rent,
            "terminal": terminal,
        }
    )
