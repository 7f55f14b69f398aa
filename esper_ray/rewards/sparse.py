"""sparse: nothing until the last step, then the committed model's accuracy minus a parameter cost."""

from __future__ import annotations

from esper_ray.contracts.rewards import RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    if not signal.is_terminal:
        return breakdown({"terminal": 0.0})
    fossil_params = sum(s.seed_params for s in signal.slots if s.stage_after is Stage.FOSSILIZED)
    score = signal.committed_accuracy - cfg.param_penalty_weight * fossil_params / cfg.param_budget
    return breakdown({"terminal": cfg.sparse_scale * min(max(score, -1.0), 1.0)})
