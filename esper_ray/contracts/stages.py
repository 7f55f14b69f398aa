"""Seed lifecycle stages and the table of legal transitions (DOMAIN.md section 1).

This module is the single source of truth for stage names. The integer values match the original system
(5 was SHADOWING, retired), so logs stay comparable; the observation uses `STAGE_ORDER` for a contiguous
one-hot.
"""

from __future__ import annotations

from enum import IntEnum


class Stage(IntEnum):
    DORMANT = 1
    GERMINATED = 2
    TRAINING = 3
    BLENDING = 4
    HOLDING = 6
    FOSSILIZED = 7
    PRUNED = 8
    EMBARGOED = 9
    RESETTING = 10


VALID_TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.DORMANT: frozenset({Stage.GERMINATED}),
    Stage.GERMINATED: frozenset({Stage.TRAINING, Stage.PRUNED}),
    Stage.TRAINING: frozenset({Stage.BLENDING, Stage.PRUNED}),
    Stage.BLENDING: frozenset({Stage.HOLDING, Stage.PRUNED}),
    # HOLDING -> BLENDING is used for a partial re-target and for a scheduled prune's alpha ramp.
    Stage.HOLDING: frozenset({Stage.FOSSILIZED, Stage.BLENDING, Stage.PRUNED}),
    Stage.FOSSILIZED: frozenset(),
    Stage.PRUNED: frozenset({Stage.EMBARGOED}),
    Stage.EMBARGOED: frozenset({Stage.RESETTING}),
    Stage.RESETTING: frozenset({Stage.DORMANT}),
}

# Stages whose seed module runs in the forward pass. GERMINATED holds a seed that is not run yet.
ACTIVE_STAGES = frozenset({Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})
# Stages in which a seed module exists (it is freed when the slot reaches PRUNED).
LIVE_STAGES = frozenset({Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING})
# Stages of the post-prune cool-down; the slot is unusable until it is DORMANT again.
COOLDOWN_STAGES = frozenset({Stage.PRUNED, Stage.EMBARGOED, Stage.RESETTING})

# Contiguous order for one-hot encodings (10 entries, as the original's stage schema).
STAGE_ORDER: tuple[Stage | None, ...] = (
    None,  # no seed
    Stage.DORMANT,
    Stage.GERMINATED,
    Stage.TRAINING,
    Stage.BLENDING,
    Stage.HOLDING,
    Stage.FOSSILIZED,
    Stage.PRUNED,
    Stage.EMBARGOED,
    Stage.RESETTING,
)


class IllegalTransitionError(RuntimeError):
    """A lifecycle action asked for a stage change that the transition table forbids."""

    def __init__(self, slot: str, current: Stage, target: Stage, why: str = "") -> None:
        allowed = sorted(s.name for s in VALID_TRANSITIONS[current]) or ["none: terminal"]
        message = (
            f"slot {slot}: illegal transition {current.name} -> {target.name} "
            f"(allowed from {current.name}: {', '.join(allowed)})"
        )
        if why:
            message += f"; {why}"
        super().__init__(message)
        self.slot = slot
        self.current = current
        self.target = target


def check_transition(slot: str, current: Stage, target: Stage) -> None:
    """Raise IllegalTransitionError unless `current -> target` is in VALID_TRANSITIONS."""
    if target not in VALID_TRANSITIONS[current]:
        raise IllegalTransitionError(slot, current, target)
