"""basic_plus: basic, with the fossilize bonus partly deferred and paid for the fossil's ongoing contribution.

30 % of the bonus is paid when the seed is fossilized; 70 % goes into the slot's drip pool. Every following
epoch the fossil earns drip_scale * c, c its current counterfactual contribution in percentage points (the
counterfactual pass switches fossils off too in this mode), drip_scale = pool / max(epochs left, 5), clipped
to [-0.05, +0.1]; the pool shrinks by drip_scale each epoch, whatever the fossil earned (DOMAIN.md section 8).
A fossil that stops helping earns nothing more, or a little less.
"""

from __future__ import annotations

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import PP, RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import basic

IMMEDIATE_SHARE = 0.3
MIN_DRIP_EPOCHS = 5
DRIP_CLIP = (-0.05, 0.1)


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    parts = basic.compute(signal, cfg).components
    bonus = parts.pop("fossilize")
    pools = {s.slot_id: s.drip_pool for s in signal.slots}
    immediate = bonus
    target = signal.target
    if signal.op is Op.FOSSILIZE and target is not None and bonus > 0 and target.stage_after is Stage.FOSSILIZED:
        immediate = IMMEDIATE_SHARE * bonus
        pools[target.slot_id] += bonus - immediate
    drip = 0.0
    epochs_left = max(signal.max_epochs - signal.epoch, 0)
    for s in signal.slots:
        pool = pools[s.slot_id]
        if (
            s.stage_after is not Stage.FOSSILIZED
            or pool <= 0
            or s.contribution_after is None
            or s.slot_id == signal.target_slot
            and signal.op is Op.FOSSILIZE
        ):
            continue
        scale = pool / max(epochs_left, MIN_DRIP_EPOCHS)
        drip += min(max(scale * PP * s.contribution_after, DRIP_CLIP[0]), DRIP_CLIP[1])
        pools[s.slot_id] = max(pool - scale, 0.0)
    parts.update(fossilize=immediate, drip=drip)
    return breakdown(parts, drip_pools=pools)
