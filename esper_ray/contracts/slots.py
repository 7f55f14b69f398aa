"""Slot ids `r{row}c{col}`: row 0 sits after block `col` before its pooling, row 1 after that pooling."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_SLOT_RE = re.compile(r"^r([01])c(\d+)$")


def parse_slot_id(slot_id: str) -> tuple[int, int]:
    """Return (row, col) of a slot id, or raise ValueError explaining the format."""
    match = _SLOT_RE.match(slot_id) if isinstance(slot_id, str) else None
    if match is None:
        raise ValueError(
            f"bad slot name {slot_id!r}: slots are named r{{row}}c{{col}} with row 0 (before pooling) "
            f"or 1 (after pooling), e.g. 'r0c1'"
        )
    return int(match.group(1)), int(match.group(2))


def slot_id(row: int, col: int) -> str:
    return f"r{row}c{col}"


def action_order(slot_ids: Iterable[str]) -> list[str]:
    """Slots in the order of the action head and the observation: row-major (r0c*, then r1c*)."""
    return sorted(slot_ids, key=parse_slot_id)


def forward_position(slot_id: str) -> tuple[int, int]:
    """Where a slot sits in the forward pass, comparable between slots: after block `col`, row 0 before its
    pooling, row 1 after (not the action order, which is row-major)."""
    row, col = parse_slot_id(slot_id)
    return col, row


def is_grid_slot(slot_id: str) -> bool:
    """Whether a slot is named `r{row}c{col}` (the built-in hosts' slots; a plug-in host names its own)."""
    return isinstance(slot_id, str) and _SLOT_RE.match(slot_id) is not None


def check_slots(requested: Sequence[str], available: Sequence[str]) -> list[str]:
    """Validate a slot selection against what a host offers (in its action order); return it in that order."""
    if len(requested) == 0:
        raise ValueError(f"slots: at least one slot is needed; this host offers {list(available)}")
    grid = all(is_grid_slot(s) for s in available)
    for s in requested:
        if grid:
            parse_slot_id(s)  # a malformed name is told the format
        if s not in available:
            raise ValueError(f"slot {s!r} does not exist in this host; available slots: {list(available)}")
    if len(set(requested)) != len(requested):
        raise ValueError(f"slots: {list(requested)} names a slot twice")
    return sorted(requested, key=list(available).index)
