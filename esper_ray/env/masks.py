"""Which actions are legal now (DOMAIN.md section 5), as one flat mask over the MultiDiscrete heads.

The joint (op, slot) head allows exactly the legal pairs; the mask is read off the slots' own predicates,
so the mask and what a slot accepts cannot drift apart. Other heads: blueprint allows the blueprints of the
host's topology (a CNN blueprint is illegal on a transformer and the other way round), a plug-in's among them at its
vocabulary index, the rest every value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from esper_ray.contracts.actions import (
    CNN_BLUEPRINTS,
    HEAD_NAMES,
    HEAD_SIZES_AFTER_JOINT,
    MAX_BLUEPRINTS,
    RELEVANT_HEADS,
    AlphaCurve,
    AlphaSpeed,
    AlphaTarget,
    BlendAlgorithm,
    BlueprintId,
    FactoredAction,
    Op,
    Style,
    Tempo,
    blueprint_at,
    decode_joint,
    encode_joint,
    joint_size,
)
from esper_ray.contracts.slots import forward_position
from esper_ray.contracts.stages import COOLDOWN_STAGES, LIVE_STAGES, Stage
from esper_ray.morpho.slot import SeedSlot

# Germination waits while any seed is still young or any slot cools down (rule "D3": one seed develops
# at a time; a BLENDING seed may finish while the next one trains).
BLOCKS_GERMINATION = frozenset({Stage.GERMINATED, Stage.TRAINING}) | COOLDOWN_STAGES


def action_nvec() -> list[int]:
    """Sizes of the action heads: the same on every host (the joint head is sized for MAX_SLOTS)."""
    return [joint_size(), *HEAD_SIZES_AFTER_JOINT]


def head_offsets() -> dict[str, slice]:
    offsets, start = {}, 0
    for name, size in zip(HEAD_NAMES, action_nvec()):
        offsets[name] = slice(start, start + size)
        start += size
    return offsets


# Stages of a seed that blends toward its alpha target or holds it.
BLENDED_STAGES = frozenset({Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})


def cut_off(slot: SeedSlot, slots: Sequence[SeedSlot]) -> bool:
    """Whether the loss cannot reach `slot`, or will not once the seed below is kept: downstream of it an isolated
    seed (a CNN seed reads the host detached at every stage, slot.py) blends by ADD, toward any target, or holds
    it. ADD passes the host (1 - alpha) of the gradient, so at alpha 1 nothing upstream gets any: a seed planted
    there has a gradient of exactly 0, gate G2 (gradient health) never lets it blend, and the run drops it
    (docs/design.md). A seed blending toward a lower target still cuts the slot off if it is kept, since it is
    fossilized only at alpha 1 (gate G3): a seed planted upstream of one at 0.5 was still blending when the run ended
    (docs/learning.md s. 8). A prune ramping the downstream seed out gives the gradient back, so a pruning seed cuts
    nothing off."""
    here = forward_position(slot.slot_id)
    return any(
        forward_position(s.slot_id) > here
        and s.isolated
        and s.algorithm is BlendAlgorithm.ADD
        and s.stage in BLENDED_STAGES
        and not s.pruning
        for s in slots
    )


def legal_ops(
    slot: SeedSlot,
    slots: Sequence[SeedSlot],
    *,
    auto_forward: bool,
    max_seeds: int,
    time_to_commit: bool = True,
    mask_cut_off: bool = False,
) -> set[Op]:
    """`time_to_commit`: whether a seed germinated now could still be fossilized before the run ends (the env's
    `commit_horizon`); False masks GERMINATE. `mask_cut_off` (the env's setting of that name) masks GERMINATE in
    a slot the loss cannot reach (`cut_off`)."""
    ops: set[Op] = set()
    live = sum(s.is_live for s in slots)
    if (
        slot.stage is Stage.DORMANT
        and live < max_seeds
        and time_to_commit
        and not any(s.stage in BLOCKS_GERMINATION for s in slots)
        and not (mask_cut_off and cut_off(slot, slots))
    ):
        ops.add(Op.GERMINATE)
    if slot.can_set_alpha_target():
        ops.add(Op.SET_ALPHA_TARGET)
    if slot.can_prune():
        ops.add(Op.PRUNE)
    if slot.stage is Stage.HOLDING:
        ops.add(Op.FOSSILIZE)
    if not auto_forward and slot.stage in LIVE_STAGES - {Stage.HOLDING} and not slot.pruning:
        ops.add(Op.ADVANCE)
    return ops


def compute_mask(
    slots: Sequence[SeedSlot],
    *,
    auto_forward: bool,
    max_seeds: int,
    blueprints: Sequence[BlueprintId] = CNN_BLUEPRINTS,
    tempos: Sequence[Tempo] = tuple(Tempo),
    mask_cut_off: bool = False,
) -> np.ndarray:
    """`blueprints`: those that fit the host (its topology's, less any that cannot run on this device);
    `tempos`: those a seed germinated now may take (the env's `commit_horizon`: those whose lifecycle still ends
    before the run does). None left masks GERMINATE (legal_ops' `time_to_commit`); the tempo head, which only
    GERMINATE reads, then stays open so that no head is all masked. `mask_cut_off`: see legal_ops."""
    time_to_commit = bool(tempos)
    offsets = head_offsets()
    mask = np.zeros(sum(action_nvec()), dtype=np.int8)
    joint = np.zeros(joint_size(), dtype=np.int8)  # positions past the host's slots stay masked
    joint[encode_joint(Op.WAIT, None)] = 1
    for i, slot in enumerate(slots):
        for op in legal_ops(
            slot,
            slots,
            auto_forward=auto_forward,
            max_seeds=max_seeds,
            time_to_commit=time_to_commit,
            mask_cut_off=mask_cut_off,
        ):
            joint[encode_joint(op, i)] = 1
    mask[offsets["op_slot"]] = joint
    blueprint = np.zeros(MAX_BLUEPRINTS, dtype=np.int8)
    blueprint[[int(b) for b in blueprints]] = 1
    mask[offsets["blueprint"]] = blueprint
    for name in HEAD_NAMES[2:]:
        mask[offsets[name]] = 1
    if time_to_commit:
        tempo = np.zeros(len(Tempo), dtype=np.int8)
        tempo[[int(t) for t in tempos]] = 1
        mask[offsets["tempo"]] = tempo
    return mask


def allows(mask: np.ndarray, op: Op, slot_index: int | None, tempo: Tempo = Tempo.STANDARD) -> bool:
    """Whether `mask` allows `op` on the slot; for GERMINATE, at `tempo` too (commit_horizon masks the tempos whose
    lifecycle would end after the run). What a rule-based controller asks before it acts."""
    offsets = head_offsets()
    legal = bool(mask[offsets["op_slot"]][encode_joint(op, slot_index)])
    return legal and (op is not Op.GERMINATE or bool(mask[offsets["tempo"]][int(tempo)]))


def decode_action(action: Sequence[int], mask: np.ndarray, slot_ids: Sequence[str]) -> FactoredAction:
    """Decode a MultiDiscrete action; raise ValueError if it picks a masked value of a head that matters."""
    offsets = head_offsets()
    raw = np.asarray(action).ravel()
    if len(raw) != len(HEAD_NAMES):
        raise ValueError(f"action has {len(raw)} components; expected {len(HEAD_NAMES)} ({', '.join(HEAD_NAMES)})")
    values = []
    for name, size, value in zip(HEAD_NAMES, action_nvec(), raw):
        if isinstance(value, (bool, np.bool_)) or not float(value).is_integer():
            raise ValueError(f"action head {name}={value.item()!r}: must be a whole number in [0, {size})")
        if not 0 <= int(value) < size:
            raise ValueError(f"action head {name}={int(value)}: out of range [0, {size})")
        values.append(int(value))
    op, slot_index = decode_joint(values[0])
    if not mask[offsets["op_slot"]][values[0]]:
        where = (
            ""
            if slot_index is None
            else (
                f" on slot {slot_ids[slot_index]}"
                if slot_index < len(slot_ids)
                else f" on slot position {slot_index}, which this host does not have"
            )
        )
        raise ValueError(f"masked action: {op.name}{where} is not legal now (joint index {values[0]})")
    for name, value in zip(HEAD_NAMES[1:], values[1:]):
        if name in RELEVANT_HEADS[op] and not mask[offsets[name]][value]:
            raise ValueError(f"masked action: head {name}={value} is not legal for {op.name}")
    relevant = RELEVANT_HEADS[op]
    default = FactoredAction(op=op)
    return FactoredAction(
        op=op,
        slot=slot_ids[slot_index] if slot_index is not None else None,
        blueprint=blueprint_at(values[1]) if "blueprint" in relevant else default.blueprint,
        style=Style(values[2]) if "style" in relevant else default.style,
        tempo=Tempo(values[3]) if "tempo" in relevant else default.tempo,
        alpha_target=AlphaTarget(values[4]) if "alpha_target" in relevant else default.alpha_target,
        alpha_speed=AlphaSpeed(values[5]) if "alpha_speed" in relevant else default.alpha_speed,
        alpha_curve=AlphaCurve(values[6]) if "alpha_curve" in relevant else default.alpha_curve,
    )
