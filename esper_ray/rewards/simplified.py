"""simplified: PBRS, a small cost per non-WAIT action, terminal accuracy and a bonus per contributing fossil.

No rent: a diagnostic mode, not evidence that growth pays for itself (DOMAIN.md section 8).
"""

from __future__ import annotations

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import components as rc


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    terminal = 0.0
    if signal.is_terminal:
        contributing = sum(
            s.stage_after is Stage.FOSSILIZED
            and s.contribution is not None
            and 100 * s.contribution >= rc.CONTRIBUTING_PP
            for s in signal.slots
        )
        terminal = 3.0 * signal.committed_accuracy + 2.0 * contributing  # what the run keeps
    return breakdown(
        {
            "pbrs": rc.pbrs(signal, cfg),
            "action": -0.01 if signal.op is not Op.WAIT else 0.0,
            "terminal": terminal,
        }
    )
