"""What the counterfactual rows of a validation pass say about each seed: its contribution (the model without it)
and its interactions with the others (pairs of seeds off)."""

from __future__ import annotations

from esper_ray.env.epoch import ValStats
from esper_ray.morpho.counterfactual import CounterfactualPlan
from esper_ray.morpho.model import MorphogeneticModel


def record_counterfactuals(model: MorphogeneticModel, plan: CounterfactualPlan, val: ValStats) -> None:
    main = val.accuracy(0)
    for slot_id in plan.ablated_slots:
        model.slot(slot_id).metrics.record_contribution(main - val.accuracy(plan.row(f"off:{slot_id}")))
    interactions = {s: 0.0 for s in plan.ablated_slots}
    for a, b in plan.pairs:  # I_ab = f(all) - f(all - a) - f(all - b) + f(all - a - b)
        i_ab = (
            main
            - val.accuracy(plan.row(f"off:{a}"))
            - val.accuracy(plan.row(f"off:{b}"))
            + val.accuracy(plan.row(f"off:{a}+{b}"))
        )
        interactions[a] += i_ab
        interactions[b] += i_ab
    for s in model.seed_slots():
        s.metrics.interaction_sum = interactions.get(s.slot_id, 0.0)
