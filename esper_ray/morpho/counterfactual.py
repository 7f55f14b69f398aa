"""Which alpha configurations one fused validation pass evaluates (DOMAIN.md section 9).

`main` is the model as is; `off:<slot>` switches one blending/holding seed off (leave-one-out, giving its
contribution); `all_off` switches every such seed off, leaving only fossilized seeds on (the "committed"
model, which the sparse reward scores). Fossilized seeds are never ablated: they are part of the host now.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esper_ray.contracts.stages import Stage
from esper_ray.morpho.model import MorphogeneticModel


@dataclass(frozen=True)
class CounterfactualPlan:
    names: tuple[str, ...]
    alphas: torch.Tensor
    """[K, S] alpha per configuration and slot."""
    ablated_slots: tuple[str, ...]
    """Slots with an `off:` configuration (alpha > 0, not fossilized)."""

    @property
    def committed_index(self) -> int:
        """Row of the configuration with only fossilized seeds on (no extra row when it equals another)."""
        if not self.ablated_slots:
            return 0
        if len(self.ablated_slots) == 1:
            return 1
        return self.names.index("all_off")


def build_plan(model: MorphogeneticModel) -> CounterfactualPlan:
    main = model.current_alphas()
    slots = model.seed_slots()
    ablated = [i for i, s in enumerate(slots) if main[i] > 0 and s.stage is not Stage.FOSSILIZED]
    names, rows = ["main"], [main]
    for i in ablated:
        row = main.clone()
        row[i] = 0.0
        names.append(f"off:{slots[i].slot_id}")
        rows.append(row)
    if len(ablated) >= 2:
        row = main.clone()
        row[ablated] = 0.0
        names.append("all_off")
        rows.append(row)
    return CounterfactualPlan(tuple(names), torch.stack(rows), tuple(slots[i].slot_id for i in ablated))
