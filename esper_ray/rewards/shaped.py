"""shaped (default): counterfactual attribution plus PBRS, rent and action shaping (DOMAIN.md section 8).

Departure from the original, on purpose: attribution is summed over every live seed with a measured
contribution, rather than paid for one slot chosen by the action (the original canonicalised WAIT to the
first slot and paid that seed's terms, whichever seed mattered).
"""

from __future__ import annotations

import math

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import PP, RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import components as rc

FOSSILIZE_BONUS = 3.0 * math.tanh(1.0 / 3.0)  # ~0.97


def action_shaping(signal: StepSignal) -> float:
    """Costs and bonuses tied to the op itself."""
    target = signal.target
    op = signal.op
    if op is Op.WAIT:
        return 0.0
    if not signal.action_success:
        return -1.0 if op is Op.FOSSILIZE else -0.05
    if op is Op.GERMINATE:
        return -0.15
    if op is Op.SET_ALPHA_TARGET:
        return -0.005
    if op is Op.ADVANCE:
        return -0.1 if target is not None and target.stage_before is Stage.TRAINING else 0.0
    assert target is not None, f"{op.name} without a target slot"
    c = PP * target.contribution if target.contribution is not None else 0.0
    cf = PP * signal.cf_total
    if op is Op.FOSSILIZE:
        legit = rc.holding_legitimacy(target)
        if cf < 0:
            shaping = -0.5 - min(0.2 * abs(cf), 1.0) - (0.3 if rc.is_ransomware(signal, target) else 0.0)
        elif c >= rc.CONTRIBUTING_PP:
            shaping = (0.5 + 0.1 * c) * legit + FOSSILIZE_BONUS * legit
        else:
            shaping = -0.2
        return -0.01 + shaping
    # PRUNE
    if target.age < rc.MIN_PRUNE_AGE:
        shaping = -0.3 * (rc.MIN_PRUNE_AGE - target.age)
    elif c < -0.5:
        shaping = 0.15
    elif c < 0:
        shaping = 0.1
    else:
        shaping = max(-0.3 - 0.05 * c, -0.9)
    return -0.005 + shaping


def stage_warnings(signal: StepSignal) -> float:
    """A blending seed while the seeds hurt, or a holding seed left undecided while it earns credit."""
    total = 0.0
    cf = PP * signal.cf_total
    for s in signal.slots:
        if s.stage_after is Stage.BLENDING and cf < 0:
            total -= 0.1 + min(0.05 * s.epochs_in_stage_after, 0.3)
        decided = s.slot_id == signal.target_slot and signal.op in (Op.FOSSILIZE, Op.PRUNE)
        if (
            s.stage_before is Stage.HOLDING
            and not decided
            and s.epochs_in_stage_before >= 2
            and rc.attribution(signal, s) > 0
        ):
            total -= min(0.1 + 0.05 * max(0, s.epochs_in_stage_before - 2), 0.3)
    return total


def synergy(signal: StepSignal) -> float:
    """+0.1 tanh(0.5 I) for each live seed whose pair interactions I (pp) with the others sum positive."""
    return sum(0.1 * math.tanh(0.5 * PP * s.interaction_sum) for s in rc.live_seeds(signal) if s.interaction_sum > 0)


def non_attribution_components(signal: StepSignal, cfg: RewardConfig) -> dict[str, float]:
    """Everything of `shaped` except the attribution credit (escrow pays attribution its own way)."""
    parts = {
        "ratio_penalty": sum(rc.ratio_penalty(signal, s) for s in rc.live_seeds(signal)),
        "stage_warnings": stage_warnings(signal),
        "pbrs": rc.pbrs(signal, cfg),
        "synergy": synergy(signal),
        "rent": rc.rent(signal, cfg),
        "alpha_shock": rc.alpha_shock(signal),
        "occupancy": rc.occupancy(signal),
        "action": action_shaping(signal),
        "terminal": 0.05 * PP * signal.committed_accuracy if signal.is_terminal else 0.0,  # what the run keeps
    }
    return parts


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    parts = {"attribution": sum(rc.attribution(signal, s) for s in rc.live_seeds(signal))}
    parts.update(non_attribution_components(signal, cfg))
    return breakdown(parts)
