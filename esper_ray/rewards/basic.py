"""basic: PBRS, a parameter cost, a fossilize bonus and a terminal reward for accuracy gained in the episode.

Departure from the original, on purpose: the terminal term uses the improvement since the episode began
(what the original's docstring promised), not the last epoch's change (what its code did).
"""

from __future__ import annotations

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import PP, RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import components as rc


def fossilize_bonus(signal: StepSignal) -> float:
    target = signal.target
    if signal.op is not Op.FOSSILIZE or target is None:
        return 0.0
    c = PP * target.contribution if target.contribution is not None else 0.0
    cf = PP * signal.cf_total
    if signal.action_success and target.stage_before is Stage.HOLDING and cf > 0 and c >= rc.CONTRIBUTING_PP:
        harmonic = 2 * cf * c / (cf + c)
        return (0.3 + 0.5 * harmonic) * rc.holding_legitimacy(target)
    if rc.is_ransomware(signal, target) or not signal.action_success:
        return -0.5
    return -0.2


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    terminal = 0.0
    if signal.is_terminal:
        terminal = cfg.basic_acc_delta_weight * (
            signal.committed_accuracy - signal.initial_val_accuracy
        )  # what the run keeps
    return breakdown(
        {
            "pbrs": rc.pbrs(signal, cfg),
            "param_cost": -cfg.param_penalty_weight * rc.rent_overhead(signal) / cfg.param_budget,
            "fossilize": fossilize_bonus(signal),
            "terminal": terminal,
        }
    )
