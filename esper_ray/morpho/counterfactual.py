"""Which alpha configurations one fused validation pass evaluates (DOMAIN.md section 9).

`main` is the model as is; `off:<slot>` switches one blending/holding seed off (leave-one-out, giving its
contribution); `off:<a>+<b>` switches a pair off (with two or more such seeds), giving their interaction
I_ab = f(all) - f(all - a) - f(all - b) + f(all - a - b) (DOMAIN.md section 9, with the other seeds on);
`all_off` switches every such seed off, leaving only fossilized seeds on (the "committed" model, which the
sparse reward scores). Fossilized seeds are ablated only when asked (`ablate_fossils`, for basic_plus's drip,
which pays a fossil by its ongoing contribution); otherwise they are part of the host now.
"""

from __future__ import annotations

import itertools
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
    """Slots with an `off:` configuration (alpha > 0; not fossilized unless fossils are ablated too)."""
    pairs: tuple[tuple[str, str], ...] = ()
    """Pairs of ablated slots with an `off:a+b` configuration (every pair, when two or more are ablated)."""
    committed_slots: tuple[str, ...] = ()
    """Ablated fossils: on in the committed model."""

    def row(self, name: str) -> int:
        return self.names.index(name)

    @property
    def committed_index(self) -> int:
        """Row of the configuration with only fossilized seeds on (no extra row when it equals another)."""
        live = [s for s in self.ablated_slots if s not in self.committed_slots]
        if not live:
            return 0
        if len(live) == 1:
            return self.row(f"off:{live[0]}")
        return self.row("all_off")


def build_plan(model: MorphogeneticModel, ablate_fossils: bool = False) -> CounterfactualPlan:
    main = model.current_alphas()
    slots = model.seed_slots()
    ablated = [i for i, s in enumerate(slots) if main[i] > 0 and (ablate_fossils or s.stage is not Stage.FOSSILIZED)]
    fossils = [i for i in ablated if slots[i].stage is Stage.FOSSILIZED]
    live = [i for i in ablated if i not in fossils]
    names, rows = ["main"], [main]

    def off(indices: list[int], name: str) -> None:
        row = main.clone()
        row[indices] = 0.0
        names.append(name)
        rows.append(row)

    for i in ablated:
        off([i], f"off:{slots[i].slot_id}")
    pairs = list(itertools.combinations(ablated, 2)) if len(ablated) >= 2 else []
    for i, j in pairs:
        off([i, j], f"off:{slots[i].slot_id}+{slots[j].slot_id}")
    if len(live) >= 2:
        off(live, "all_off")
    return CounterfactualPlan(
        tuple(names),
        torch.stack(rows),
        tuple(slots[i].slot_id for i in ablated),
        pairs=tuple((slots[i].slot_id, slots[j].slot_id) for i, j in pairs),
        committed_slots=tuple(slots[i].slot_id for i in fossils),
    )
