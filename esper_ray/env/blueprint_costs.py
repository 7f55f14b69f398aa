"""What each offered blueprint would add at each slot: the observation's `blueprint_costs` (issue 75).

[MAX_SLOTS, MAX_BLUEPRINTS, 2]: for slot position s and vocabulary index b, the parameters and the forward FLOPs per
row that a seed of blueprint b planted at s would add, each relative to the host's own, as
log(1 + COST_SCALE x added / host) / log(1 + COST_SCALE): 0 for nothing, 1 for a seed as big as the host, about 0.5
for one a hundredth of it (a plain ratio would put every seed but the largest at ~0). Zero where the blueprint is not
offered (masked) or the position is absent. Fixed for a host, so computed once per host (morpho/flops.py seed_cost
caches each count): the slot policy scores every offered blueprint from its embedding and these costs, so a blueprint
a plug-in registers under a new name is scored by what it adds, not by an embedding row no run has trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from esper_ray.contracts.actions import MAX_BLUEPRINTS, MAX_SLOTS, BlueprintId
from esper_ray.contracts.host import Topology
from esper_ray.env.observation import FEATURE_BOUND
from esper_ray.morpho.flops import host_flops, host_params, seed_cost

COST_FEATURES = ("params", "flops")
"""The cost features of a (slot, blueprint), in the last axis's order."""
COST_SCALE = 1e4
"""Ratios down to 1e-4 of the host stay distinguishable (log1p(1) / log1p(1e4) = 0.075)."""


def relative_cost(added: int, host: int) -> float:
    """log(1 + COST_SCALE x added / host) / log(1 + COST_SCALE), within [0, FEATURE_BOUND]."""
    value = math.log1p(COST_SCALE * max(added, 0) / max(host, 1)) / math.log1p(COST_SCALE)
    return min(value, FEATURE_BOUND)


def blueprint_costs(
    preset: str, topology: Topology, slot_shapes: Sequence[tuple[int, ...]], blueprints: Sequence[BlueprintId]
) -> np.ndarray:
    """The costs of `blueprints` (those the host offers) at each of the host's slots (`slot_shapes`, in the
    observation's slot order), relative to host `preset`'s parameters and forward FLOPs per row."""
    costs = np.zeros((MAX_SLOTS, MAX_BLUEPRINTS, len(COST_FEATURES)), dtype=np.float32)
    params, flops = host_params(preset), host_flops(preset).forward
    for s, shape in enumerate(slot_shapes):
        for b in blueprints:
            added_params, added_flops = seed_cost(b, topology, tuple(shape))
            costs[s, int(b)] = (relative_cost(added_params, params), relative_cost(added_flops, flops))
    return costs
