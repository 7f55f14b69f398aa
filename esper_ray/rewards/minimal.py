"""minimal: sparse, plus -0.1 for pruning a seed younger than 5 epochs (DOMAIN.md section 8)."""

from __future__ import annotations

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.rewards import components as rc
from esper_ray.rewards import sparse

YOUNG_PRUNE_PENALTY = -0.1


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    parts = dict(sparse.compute(signal, cfg).components)
    target = signal.target
    young = signal.op is Op.PRUNE and signal.action_success and target is not None and target.age < rc.MIN_PRUNE_AGE
    parts["young_prune"] = YOUNG_PRUNE_PENALTY if young else 0.0
    return breakdown(parts)
