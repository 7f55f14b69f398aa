"""committed: the gain in the accuracy of the network the run keeps, paid as it accrues (issue 30).

The user's objective is the held-out quality of the committed model at the end of a host run (the host and its
fossils; docs/design.md, "The end of a host run"), at its size. This mode pays exactly that, densely:

    Phi(s)   = PP * accuracy(s) - cost(s)                 while the run goes on: the model as it runs, seeds on
                                                           probation in at their alpha
    Phi(s_T) = PP * committed_accuracy(s_T) - cost(committed)   at the run's end: only what is kept
    r_t      = gamma * Phi(s_t+1) - Phi(s_t)

so the discounted return of an episode is gamma^T Phi(s_T) - Phi(s_0): the final committed validation accuracy
less its parameter cost (Phi(s_0), the untrained host, does not depend on the policy). Every step's reward is
the potential difference, so nothing is paid for a stage, an op or a seed's attribution as such: a seed that
blends in and helps raises the accuracy at once; if it is still on probation when the run ends, the last step
takes back what it brought (and whatever the host lost by adapting to it), and a FOSSILIZE is what avoids that.
`measurements/reward_terms.py` prints, per mode, what a fossilize is worth to the policy.

cost(params) = param_cost_pp * log2(1 + seed params in the forward / host params): `param_cost_pp` points of
accuracy for each doubling of the network (seeds counted at their alpha while the run goes on).

`stage_shaping` adds potential-based shaping on the seeds' lifecycle stages (components.potential: a stage's value
plus time in it), weight `committed_stage_weight`, with the potential of the run's end set to 0: it sums to zero
over every run (Ng et al. 1999), so it changes no policy's ranking; it can speed up an untrained critic. It does
not solve exploration (it cancels out of the advantage once the critic is accurate): an untrained policy prunes a
seed long before it blends, and the policy's PRUNE prior (TrainConfig.prune_logit) is what lets seeds live long
enough to show their worth (docs/learning.md, section 8). The A/B behind this mode's default ran with weight 1.
"""

from __future__ import annotations

import math

from esper_ray.contracts.rewards import PP, RewardBreakdown, RewardConfig, StepSignal, breakdown
from esper_ray.contracts.stages import Stage
from esper_ray.rewards.components import RENT_STAGES, potential


def size_cost(seed_params: float, host_params: int, cfg: RewardConfig) -> float:
    """Accuracy points charged for a network of `host_params` plus `seed_params`."""
    return cfg.param_cost_pp * math.log2(1.0 + seed_params / max(host_params, 1))


def potential_before(signal: StepSignal, cfg: RewardConfig) -> float:
    """Phi of the state the decision was taken in (never terminal: a decision follows it)."""
    params = sum(s.alpha_before * s.seed_params for s in signal.slots if s.stage_before in RENT_STAGES)
    return PP * signal.prev_val_accuracy - size_cost(params, signal.host_params, cfg)


def running_potential(signal: StepSignal, cfg: RewardConfig) -> float:
    """Phi of the state the step led to as if the run went on: the model as it runs."""
    params = sum(s.alpha_after * s.seed_params for s in signal.slots if s.stage_after in RENT_STAGES)
    return PP * signal.val_accuracy - size_cost(params, signal.host_params, cfg)


def committed_potential(signal: StepSignal, cfg: RewardConfig) -> float:
    """Phi of the run's end: the committed model, host and fossils."""
    params = sum(s.alpha_after * s.seed_params for s in signal.slots if s.stage_after is Stage.FOSSILIZED)
    return PP * signal.committed_accuracy - size_cost(params, signal.host_params, cfg)


def compute(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    """`accuracy_gain`: the potential difference as if the run went on; `end_of_run` (last step only): what the
    end changes, dropping the seeds still on probation (their accuracy, less the size cost they no longer add)."""
    running = running_potential(signal, cfg)
    parts = {"accuracy_gain": cfg.gamma * running - potential_before(signal, cfg)}
    if signal.is_terminal:
        parts["end_of_run"] = cfg.gamma * (committed_potential(signal, cfg) - running)
    parts["stage_shaping"] = stage_shaping(signal, cfg)
    return breakdown(parts)


def stage_shaping(signal: StepSignal, cfg: RewardConfig) -> float:
    """w * (gamma * Phi_stage(s') - Phi_stage(s)) over the slots, Phi_stage of the run's end 0."""
    before = sum(potential(s.stage_before, s.epochs_in_stage_before) for s in signal.slots)
    after = 0.0 if signal.is_terminal else sum(potential(s.stage_after, s.epochs_in_stage_after) for s in signal.slots)
    return cfg.committed_stage_weight * (cfg.gamma * after - before)
