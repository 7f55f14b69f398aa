"""The observation: 23 base features + 37 per slot position (DOMAIN.md section 6) for MAX_SLOTS positions, slot
blueprint ids, action mask. A slot's block is its 31 measured features, then 6 descriptors of where it sits
(present, depth fraction, width, topology one-hot), so a position means the same on any host; the positions past the
host's slots are absent: all zero, blueprint id NONE (and masked in the action head: masks.py).

Features are raw (unnormalised) and bounded; normalisation happens in exactly one place, the policy's
env-to-module connector, so the episode stores what the policy acted on. Accuracies are fractions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from esper_ray.contracts.actions import BLUEPRINT_NONE_INDEX, MAX_SLOTS, BlueprintId, Op, blueprint_at
from esper_ray.contracts.host import SlotSpec
from esper_ray.contracts.registry import TOPOLOGIES
from esper_ray.contracts.rewards import PP
from esper_ray.contracts.slots import forward_position, is_grid_slot
from esper_ray.contracts.stages import STAGE_ORDER, Stage
from esper_ray.morpho.alpha_schedule import AlphaMode
from esper_ray.morpho.slot import SeedSlot

BASE_FEATURES = 23
SLOT_FEATURES = 31
"""Measured features of a slot (the first part of its block)."""
SLOT_DESCRIPTORS = 3 + len(TOPOLOGIES)
"""Where a slot sits, fixed for a host: present, depth fraction, width, topology one-hot (slot_descriptors)."""
SLOT_BLOCK = SLOT_FEATURES + SLOT_DESCRIPTORS
HISTORY = 5
FEATURE_BOUND = 10.0
MISSING = -1.0  # sentinel for "not measured yet"
FRESHNESS_DECAY = 0.995


def symlog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def feature_size() -> int:
    """The same on every host: the features of MAX_SLOTS slot positions, absent ones zero."""
    return BASE_FEATURES + SLOT_BLOCK * MAX_SLOTS


def slot_descriptors(host_slots: Sequence[SlotSpec], slot_ids: Sequence[str]) -> np.ndarray:
    """[len(slot_ids), SLOT_DESCRIPTORS]: present (1), depth fraction (the slot's position among all the host's slots
    in forward order, 0 first .. 1 last, 0.5 for a host of one slot), width (log2 of its channels / 10) and its
    topology one-hot. Forward order: `r{row}c{col}` slots by forward_position, a plug-in host's as slots() lists
    them."""
    specs = {s.id: s for s in host_slots}
    order = [s.id for s in host_slots]
    if all(is_grid_slot(s) for s in order):
        order = sorted(order, key=forward_position)
    rows = []
    for slot in slot_ids:
        spec = specs[slot]
        depth = order.index(slot) / (len(order) - 1) if len(order) > 1 else 0.5
        topology = [float(spec.topology.value == t) for t in TOPOLOGIES]
        rows.append([1.0, depth, math.log2(spec.channels) / 10.0, *topology])
    return np.asarray(rows, dtype=np.float32).reshape(len(slot_ids), SLOT_DESCRIPTORS)


@dataclass(frozen=True)
class EpochView:
    """What the base features are made of."""

    epoch: int
    max_epochs: int
    val_loss: float
    val_accuracy: float
    loss_history: Sequence[float]
    accuracy_history: Sequence[float]
    last_action_success: bool
    last_op: Op | None


def _padded(values: Sequence[float], scale: float, transform: bool) -> list[float]:
    recent = list(values)[-HISTORY:]
    encoded = [symlog(v) / 7.0 if transform else v / scale for v in recent]
    return [MISSING] * (HISTORY - len(encoded)) + encoded


def _clamp(x: float, bound: float = 1.0) -> float:
    return min(max(x, -bound), bound)


def base_features(view: EpochView, slots: Sequence[SeedSlot]) -> list[float]:
    n = len(slots)
    counts = [sum(s.stage is stage for s in slots) / n for stage in (Stage.TRAINING, Stage.BLENDING, Stage.HOLDING)]
    last_op = [0.0] * len(Op)
    if view.last_op is not None:
        last_op[view.last_op] = 1.0
    return [
        view.epoch / view.max_epochs,
        symlog(view.val_loss) / 7.0,
        view.val_accuracy,
        *_padded(view.loss_history, 1.0, transform=True),
        *_padded(view.accuracy_history, 1.0, transform=False),
        *counts,
        float(view.last_action_success),
        *last_op,
    ]


def slot_features(slot: SeedSlot, max_epochs: int) -> list[float]:
    if slot.stage is Stage.DORMANT:
        return [0.0] * SLOT_FEATURES
    m = slot.metrics
    stage_onehot = [float(slot.stage is s) for s in STAGE_ORDER]
    a = slot.alpha
    velocity = (a.target - a.start) / a.steps_total if a.mode is not AlphaMode.HOLD and a.steps_total else 0.0
    grads = m.gradients
    return [
        1.0,
        *stage_onehot,
        a.alpha,
        _clamp(PP * m.contribution / 10.0) if m.contribution is not None else 0.0,
        _clamp(PP * m.contribution_velocity / 10.0),
        slot.tempo_epochs / 12.0,
        a.target,
        int(a.mode) / 2.0,
        a.steps_total / max_epochs,
        a.steps_done / max_epochs,
        a.steps_left / max_epochs,
        _clamp(velocity),
        (int(slot.algorithm) - 1) / 2.0,
        _clamp(PP * m.interaction_sum / 10.0),
        min(symlog(grads.seed_norm) / 7.0, FEATURE_BOUND) if grads else 0.0,  # inf for non-finite gradients
        grads.health if grads else 0.0,
        float(grads.has_vanishing) if grads else 0.0,
        float(grads.has_exploding) if grads else 0.0,
        m.previous_health if m.previous_health is not None else MISSING,
        m.epochs_in_stage / max_epochs,
        FRESHNESS_DECAY**m.epochs_since_contribution if m.epochs_since_contribution is not None else MISSING,
        m.age / max_epochs,
    ]


def blueprint_ids(slots: Sequence[SeedSlot]) -> np.ndarray:
    """[MAX_SLOTS]: each slot's seed's blueprint, NONE for an empty slot and an absent position."""
    ids = [
        int(s.blueprint) if s.blueprint is not None and s.stage is not Stage.DORMANT else BLUEPRINT_NONE_INDEX
        for s in slots
    ]
    return np.asarray(ids + [BLUEPRINT_NONE_INDEX] * (MAX_SLOTS - len(ids)), dtype=np.int64)


def build_features(view: EpochView, slots: Sequence[SeedSlot], descriptors: np.ndarray) -> np.ndarray:
    """`descriptors`: slot_descriptors of `slots`, in their order."""
    if len(slots) > MAX_SLOTS or descriptors.shape != (len(slots), SLOT_DESCRIPTORS):
        raise ValueError(
            f"{len(slots)} slots with descriptors of shape {descriptors.shape}; at most MAX_SLOTS="
            f"{MAX_SLOTS} slots, {SLOT_DESCRIPTORS} descriptors each"
        )
    values = base_features(view, slots)
    for s, d in zip(slots, descriptors.tolist()):
        values += slot_features(s, view.max_epochs) + d
    values += [0.0] * (SLOT_BLOCK * (MAX_SLOTS - len(slots)))  # absent positions
    features = np.asarray(values, dtype=np.float32)
    if not np.isfinite(features).all():
        bad = np.flatnonzero(~np.isfinite(features)).tolist()
        raise ValueError(f"observation features {bad} are not finite: {features[bad].tolist()}")
    # The space is bounded; only a loss beyond e^70 could reach the bound.
    return np.clip(features, -FEATURE_BOUND, FEATURE_BOUND)


def slot_offset(slot_index: int) -> int:
    """Index of a slot's first feature in the feature vector."""
    return BASE_FEATURES + SLOT_BLOCK * slot_index


# Positions inside a slot's block, for readers of the observation (the heuristic controller).
SLOT_STAGE_ONEHOT = slice(1, 11)
SLOT_ALPHA = 11
SLOT_CONTRIBUTION = 12
SLOT_EPOCHS_IN_STAGE = 28
SLOT_CONTRIBUTION_FRESHNESS = 29
SLOT_PRESENT = SLOT_FEATURES  # the first descriptor
SLOT_DEPTH = SLOT_FEATURES + 1
SLOT_WIDTH = SLOT_FEATURES + 2
SLOT_TOPOLOGY = slice(SLOT_FEATURES + 3, SLOT_BLOCK)
BASE_EPOCH = 0
BASE_VAL_LOSS = 1
BASE_VAL_ACCURACY = 2


def decode_stage(slot_block: np.ndarray) -> Stage:
    """Stage of a slot from its feature block (DORMANT for an empty slot)."""
    onehot = slot_block[SLOT_STAGE_ONEHOT]
    if onehot.max() <= 0.0:
        return Stage.DORMANT
    stage = STAGE_ORDER[int(np.argmax(onehot))]
    assert stage is not None, "stage one-hot marks the unused index 0"
    return stage


def decode_contribution(slot_block: np.ndarray) -> float | None:
    """Contribution (fraction) of a slot's seed, None when never measured (clamped at +-10 pp)."""
    if slot_block[SLOT_CONTRIBUTION_FRESHNESS] == MISSING:
        return None
    return float(slot_block[SLOT_CONTRIBUTION]) * 10.0 / PP


def blueprint_of(index: int) -> BlueprintId | None:
    return None if index == BLUEPRINT_NONE_INDEX else blueprint_at(index)
