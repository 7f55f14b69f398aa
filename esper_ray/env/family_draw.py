"""A family's member for each episode (contracts/families.py): which one, and every member checked when the env is
built rather than at its first draw."""

from __future__ import annotations

import numpy as np
import torch

from esper_ray.contracts.actions import check_slot_count
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.families import Member
from esper_ray.contracts.slots import check_slots
from esper_ray.morpho.hosts import build_host

FAMILY_STREAM = 6_811
"""Keys the member draws' generator apart from the episode seeds' (both start from the run's seed)."""


def member_index(position: int, key: list[int], members: int) -> int:
    """Position g of a sequence of shuffled blocks of every member (MorphogeneticEnv._draw_member says which g)."""
    block, at = divmod(position, members)
    order = np.random.default_rng([FAMILY_STREAM, *key, block]).permutation(members)
    return int(order[at])


def check_slot_counts(name: str | None, members: tuple[tuple[Member, EnvConfig], ...]) -> None:
    """One line for a member whose host lacks one of its slots or has more than the policy's spaces hold (shapes only:
    the meta device), when the env is built rather than at the member's first draw."""
    for member, cfg in members:
        try:
            with torch.device("meta"):
                slots = check_slots(list(cfg.slots), build_host(cfg.effective_host_preset).slot_ids)
            check_slot_count(cfg.effective_host_preset, len(slots))
        except ValueError as error:
            raise ValueError(f"family {name!r}, member {member.name!r}: {error}") from None
