"""Reward pieces shared by several modes (DOMAIN.md section 8). Pure functions of a StepSignal.

Thresholds stated in percentage points in DOMAIN.md are applied to `PP * fraction`.
"""

from __future__ import annotations

import math

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import PP, STAGE_POTENTIAL, RewardConfig, SlotSignal, StepSignal
from esper_ray.contracts.stages import Stage

# Stages whose seed costs rent (it is in the forward pass with alpha > 0 or for good).
RENT_STAGES = frozenset({Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})
LIVE_OR_FOSSIL = frozenset({Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})
HOLDING_LEGITIMACY_EPOCHS = 5
MIN_PRUNE_AGE = 5
CONTRIBUTING_PP = 1.0


def potential(stage: Stage, epochs_in_stage: int) -> float:
    """Stage potential plus a small bonus for time in stage (capped), 0 for empty or cooling-down slots."""
    if stage not in STAGE_POTENTIAL:
        return 0.0
    return STAGE_POTENTIAL[stage] + min(0.3 * epochs_in_stage, 2.0)


def pbrs(signal: StepSignal, cfg: RewardConfig, weight: float | None = None) -> float:
    """Potential-based shaping over all slots: w * (gamma * Phi(s') - Phi(s)). Leaves the optimal policy unchanged."""
    before = sum(potential(s.stage_before, s.epochs_in_stage_before) for s in signal.slots)
    after = sum(potential(s.stage_after, s.epochs_in_stage_after) for s in signal.slots)
    return (cfg.pbrs_weight if weight is None else weight) * (cfg.gamma * after - before)


def rent_overhead(signal: StepSignal) -> float:
    """Parameters the seeds cost: a fixed share of the host per seed plus alpha-weighted seed parameters."""
    return sum(
        0.0039 * signal.host_params + s.alpha_after * s.seed_params
        for s in signal.slots
        if s.stage_after in RENT_STAGES
    )


def rent(signal: StepSignal, cfg: RewardConfig) -> float:
    scale = max(signal.host_params, cfg.rent_host_params_floor)
    return -min(0.5 * math.log1p(rent_overhead(signal) / scale), 1.5)


def alpha_shock(signal: StepSignal) -> float:
    """Penalty for sudden alpha changes, weighted by seed size relative to the host."""
    shock = sum(
        (s.alpha_after - s.alpha_before) ** 2 * s.seed_params / max(signal.host_params, 1) for s in signal.slots
    )
    return -min(0.1958 * shock, 1.0)


def occupancy(signal: StepSignal) -> float:
    occupied = sum(s.stage_after in LIVE_OR_FOSSIL for s in signal.slots)
    fossils = sum(s.stage_after is Stage.FOSSILIZED for s in signal.slots)
    return -0.01 * max(0, occupied - 1) - 0.002 * fossils


def progress_pp(signal: StepSignal, slot: SlotSignal) -> float | None:
    if slot.accuracy_at_germination is None:
        return None
    return PP * (signal.val_accuracy - slot.accuracy_at_germination)


def timing_discount(signal: StepSignal, slot: SlotSignal) -> float:
    """Seeds germinated in the first 10 epochs earn 0.4 -> 1.0 of their attribution (early gains are the host's)."""
    germinated_at = signal.epoch - slot.age
    return 0.4 + 0.6 * min(max(germinated_at, 0) / 10.0, 1.0)


def attribution(signal: StepSignal, slot: SlotSignal) -> float:
    """Credit for one seed's counterfactual contribution c (pp), bounded by the progress since germination."""
    if slot.contribution is None or slot.stage_before is Stage.FOSSILIZED:
        return 0.0
    c = PP * slot.contribution
    if c < 0:
        value = c
    else:
        p = progress_pp(signal, slot)
        if p is None:
            value = 0.5 * c
        elif p <= 0:
            value = 0.0
        elif c >= p:
            value = 2 * p * c / (p + c)
        else:
            value = c
    cf = PP * signal.cf_total
    if cf < 0 and value > 0:  # a seed claiming credit while the seeds together hurt earns little of it
        value *= 1.0 / (1.0 + math.exp(-3.0 * cf))
    value *= timing_discount(signal, slot)
    if slot.slot_id == signal.target_slot and signal.op is Op.PRUNE:
        value = -value
    if slot.slot_id == signal.target_slot and signal.op is Op.FOSSILIZE and cf < 0:
        value = 0.0
    return value


def ratio_penalty(signal: StepSignal, slot: SlotSignal) -> float:
    """Anti-gaming: a seed claiming far more than the seeds' total improvement is suspect."""
    if slot.contribution is None or PP * slot.contribution <= 1.0:
        return 0.0
    c, cf = PP * slot.contribution, PP * signal.cf_total
    if cf > 0.1:
        ratio = c / cf
        return -min(0.3, 0.1 * (ratio - 5) / 5) if ratio > 5 else 0.0
    return -0.3 * min(1.0, c / 10.0)


def holding_legitimacy(slot: SlotSignal) -> float:
    return min(1.0, slot.epochs_in_stage_before / HOLDING_LEGITIMACY_EPOCHS)


def is_ransomware(signal: StepSignal, slot: SlotSignal) -> bool:
    """A seed the model depends on (c > 0.1 pp) although accuracy fell since it was planted."""
    p = progress_pp(signal, slot)
    return slot.contribution is not None and PP * slot.contribution > 0.1 and p is not None and p < 0


def live_seeds(signal: StepSignal) -> list[SlotSignal]:
    return [s for s in signal.slots if s.stage_before in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING)]
