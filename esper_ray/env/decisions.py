"""One decision applied to its slot: germinate, set an alpha target, prune, fossilize, advance, or wait; counted."""

from __future__ import annotations

from collections.abc import Callable

import torch

from esper_ray.contracts.actions import FactoredAction, Op
from esper_ray.morpho.model import MorphogeneticModel


def apply_decision(
    model: MorphogeneticModel,
    decision: FactoredAction,
    counts: dict[str, int],
    *,
    episode_seed: int,
    epoch: int,
    in_layout: Callable[[torch.nn.Module], torch.nn.Module],
) -> bool:
    """Whether the decision passed (a gate or precondition may refuse it, leaving the slot unchanged)."""
    if decision.op is Op.WAIT:
        return True
    slot = model.slot(decision.slot)  # type: ignore[arg-type]
    if decision.op is Op.GERMINATE:
        with torch.random.fork_rng(devices=[]):  # seed init is reproducible from (seed, shard, epoch)
            torch.manual_seed(episode_seed + 7919 * (epoch + 1))
            result = slot.germinate(decision.blueprint, decision.style, decision.tempo, decision.alpha_target)
        in_layout(slot)  # the new seed and gate
        counts["germinated"] += 1
        if result.passed:
            counts[f"germinated/{slot.blueprint.key}"] += 1  # type: ignore[union-attr]
    elif decision.op is Op.SET_ALPHA_TARGET:
        result = slot.set_alpha_target(decision.alpha_target, decision.alpha_speed, decision.alpha_curve)
    elif decision.op is Op.PRUNE:
        result = slot.prune(decision.alpha_speed, decision.alpha_curve)
        counts["pruned"] += int(result.passed)
    elif decision.op is Op.FOSSILIZE:
        result = slot.fossilize()
        counts["fossilized"] += int(result.passed)
        if result.passed:
            counts[f"fossilized/{slot.blueprint.key}"] += 1  # type: ignore[union-attr]
    else:
        result = slot.advance()
    counts["refused"] += int(not result.passed)  # a gate or precondition said no; the slot is unchanged
    return result.passed
