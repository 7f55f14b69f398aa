"""kept: `committed`'s return, each step paying the gain of the model the run would keep if it ended now.

    Phi(s) = PP * committed_accuracy(s) - cost(fossils)      the host and its fossils, at every step
    r_t    = gamma * Phi(s_t+1) - Phi(s_t)

The discounted return is gamma^T Phi(s_T) - Phi(s_0), the same as `committed`'s (its Phi(s_T) is this Phi), so
the two rank every policy alike; they differ in when the return arrives. `committed` pays a seed's worth while it
blends and takes it back at the run's end unless it was fossilized, so the FOSSILIZE that keeps it is credited
only at the end, ten or more steps later, through the critic. Here a seed on probation earns nothing (the
committed model leaves it out, and loses whatever the host gives up by adapting to it), and the FOSSILIZE that
commits it is paid at once, the step the committed model gains it: the credit lands on the decision that earned
it. On text-starved with a 108 KB training split, a kept attention seed is worth 7 points and one left on
probation costs 4 (measurements/blueprint_returns.py; docs/learning.md, section 8).

`stage_shaping` is `committed`'s (weight `committed_stage_weight`, the run's end at 0: it sums to zero).
"""

from __future__ import annotations

from esper_ray.contracts.rewards import PP, RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards.committed import committed_potential, size_cost, stage_shaping


def potential_before(signal: StepSignal, cfg: RewardConfig) -> float:
    """Phi of the state the decision was taken in: the committed model then."""
    params = sum(s.alpha_before * s.seed_params for s in signal.slots if s.stage_before is Stage.FOSSILIZED)
    accuracy = signal.prev_val_accuracy if signal.prev_committed_accuracy is None else signal.prev_committed_accuracy
    return PP * accuracy - size_cost(params, signal.host_params, cfg)


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    """`kept_gain`: the committed model's potential difference over the step."""
    return breakdown({
        "kept_gain": cfg.gamma * committed_potential(signal, cfg) - potential_before(signal, cfg),
        "stage_shaping": stage_shaping(signal, cfg),
    })
