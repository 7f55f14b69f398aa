"""escrow: like shaped, but attribution is held as per-seed credit and paid as the change of that credit.

Credit target = max(0, sqrt(progress * contribution) + ratio penalty); the step pays the change (clipped
to +-2). A prune or a negative contribution returns the credit to 0, a fossil's credit is frozen, and at
the last step the credit of seeds that were never fossilized is taken back.
"""

from __future__ import annotations

import math

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import PP, RewardBreakdown, RewardConfig, SlotSignal, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import components as rc
from esper_ray.rewards.shaped import non_attribution_components

MAX_CREDIT_STEP = 2.0


def credit_target(signal: StepSignal, slot: SlotSignal) -> float:
    if slot.stage_after is Stage.FOSSILIZED and slot.stage_before is Stage.FOSSILIZED:
        return slot.escrow_credit
    if slot.stage_after not in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
        return 0.0
    if signal.op is Op.PRUNE and slot.slot_id == signal.target_slot:
        return 0.0
    if slot.contribution is None:
        return slot.escrow_credit
    c = PP * slot.contribution
    if c < 0:
        return 0.0
    p = rc.progress_pp(signal, slot)
    attributed = math.sqrt(max(p, 0.0) * c) if p is not None else 0.5 * c
    return max(0.0, attributed + rc.ratio_penalty(signal, slot))


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    credits: dict[str, float] = {}
    paid = 0.0
    for slot in signal.slots:
        target = credit_target(signal, slot)
        delta = min(max(target - slot.escrow_credit, -MAX_CREDIT_STEP), MAX_CREDIT_STEP)
        credits[slot.slot_id] = slot.escrow_credit + delta
        paid += delta
    forfeit = 0.0
    if signal.is_terminal:
        for slot in signal.slots:
            if slot.stage_after is not Stage.FOSSILIZED:
                forfeit -= credits[slot.slot_id]
                credits[slot.slot_id] = 0.0
    parts = {"escrow_delta": paid, "escrow_forfeit": forfeit}
    parts.update(non_attribution_components(signal, cfg))
    parts.pop("ratio_penalty")  # already inside the credit target
    return breakdown(parts, credits)
