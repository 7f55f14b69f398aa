"""The factored action: operations, blueprints, blend styles and alpha schedule choices (DOMAIN.md section 5).

Indices are part of the policy's contract (they index logits and embeddings), so they are fixed here and
nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from esper_ray.contracts import registry


class Op(IntEnum):
    WAIT = 0
    GERMINATE = 1
    SET_ALPHA_TARGET = 2
    PRUNE = 3
    FOSSILIZE = 4
    ADVANCE = 5


class Blueprint(IntEnum):
    """Blueprint ids; the value is the embedding index. NOOP is never legal (it adds nothing)."""

    NOOP = 0
    CONV_LIGHT = 1
    ATTENTION = 2
    NORM = 3
    DEPTHWISE = 4
    BOTTLENECK = 5
    CONV_SMALL = 6
    CONV_HEAVY = 7
    LORA = 8
    LORA_LARGE = 9
    MLP_SMALL = 10
    MLP = 11
    FLEX_ATTENTION = 12

    @property
    def key(self) -> str:
        """The lower-case name used in configs and on the command line (`conv_light`)."""
        return self.name.lower()


MAX_BLUEPRINTS = registry.MAX_BLUEPRINTS
"""Entries of the blueprint head (NOOP, the built-ins, then the plug-ins' names: registry.blueprint_index)."""
BLUEPRINT_NONE_INDEX = MAX_BLUEPRINTS
"""Embedding index for "no seed in this slot"."""

BLUEPRINT_TABLE: tuple[str, ...] = tuple(b.key for b in Blueprint)
"""The built-in blueprint names by head and embedding index: recorded in a checkpoint (policy/layout.py), so a policy
evaluated later knows which index is which. A plug-in name's index is the next free one in this process (every plug-in
name shares one embedding in the slot policy, so its index carries no meaning the policy learns)."""
if BLUEPRINT_TABLE[1:] != registry.BLUEPRINT_NAMES:  # the vocabulary starts with the registry's built-in names
    raise ImportError(f"Blueprint {BLUEPRINT_TABLE[1:]} and registry.BLUEPRINT_NAMES {registry.BLUEPRINT_NAMES} differ")


@dataclass(frozen=True)
class PluginBlueprint:
    """A blueprint a plug-in registered under a name of its own. It reads like a Blueprint member: `key` is its name,
    int() its vocabulary index, looked up in this process's registry (so a pickled one means the same name in a Ray
    worker that loaded the run's plug-ins)."""

    key: str

    @property
    def name(self) -> str:
        return self.key.upper()

    def __int__(self) -> int:
        return registry.blueprint_index(self.key)

    __index__ = __int__


BlueprintId = Blueprint | PluginBlueprint
"""A blueprint's identity: a built-in member or a plug-in's name."""
_BUILTIN_BY_KEY = {b.key: b for b in Blueprint if b is not Blueprint.NOOP}


def blueprint_id(name: str) -> BlueprintId:
    """The identity of blueprint `name`: a Blueprint member for a built-in name, else a PluginBlueprint (registered
    or not: see blueprint_at for one read by index)."""
    return _BUILTIN_BY_KEY.get(name) or PluginBlueprint(name)


def blueprint_at(index: int) -> BlueprintId:
    """The blueprint at vocabulary `index` in this process; ValueError for an unused or out-of-range one."""
    vocabulary = registry.blueprint_vocabulary()
    if not 0 < index < len(vocabulary):
        raise ValueError(f"blueprint index {index}: no blueprint there; registered: {list(vocabulary[1:])}")
    return blueprint_id(vocabulary[index])


CNN_BLUEPRINTS: tuple[Blueprint, ...] = (
    Blueprint.NORM,
    Blueprint.ATTENTION,
    Blueprint.DEPTHWISE,
    Blueprint.BOTTLENECK,
    Blueprint.CONV_SMALL,
    Blueprint.CONV_LIGHT,
    Blueprint.CONV_HEAVY,
)
TRANSFORMER_BLUEPRINTS: tuple[Blueprint, ...] = (
    Blueprint.NORM,
    Blueprint.ATTENTION,
    Blueprint.LORA,
    Blueprint.LORA_LARGE,
    Blueprint.MLP_SMALL,
    Blueprint.MLP,
    Blueprint.FLEX_ATTENTION,
)


def parse_blueprint(name: str | BlueprintId, allowed: tuple[BlueprintId, ...], hosts: str) -> BlueprintId:
    """A blueprint, or its name (a built-in one in any case), among `allowed` (for `hosts`, e.g. "CNN hosts");
    ValueError listing the allowed ones otherwise. No silent fallback."""
    available = ", ".join(b.key for b in allowed)
    if isinstance(name, (Blueprint, PluginBlueprint)):
        blueprint: BlueprintId = name
    else:
        by_key = {b.key: b for b in allowed}
        found = by_key.get(str(name)) or _BUILTIN_BY_KEY.get(str(name).lower())
        if found is None and str(name) not in registry.blueprint_vocabulary()[1:]:
            raise ValueError(f"unknown blueprint {name!r}; available: {available}")
        blueprint = found or blueprint_id(str(name))
    if blueprint not in allowed:
        raise ValueError(f"blueprint {blueprint.key!r} is not available for {hosts}; available: {available}")
    return blueprint


def topology_blueprints(topology: str) -> tuple[BlueprintId, ...]:
    """The blueprints registered for hosts of this topology (contracts/registry.py); the mask allows no others."""
    if topology not in registry.TOPOLOGIES:
        raise ValueError(f"topology={topology!r}: choose one of {list(registry.TOPOLOGIES)}")
    return tuple(blueprint_id(name) for name in registry.blueprint_names(topology))


def registered_blueprints() -> tuple[BlueprintId, ...]:
    """Every blueprint name registered in this process, for any topology, in vocabulary order (NOOP left out)."""
    return tuple(blueprint_id(name) for name in registry.blueprint_vocabulary()[1:])


class BlendAlgorithm(IntEnum):
    ADD = 1
    MULTIPLY = 2
    GATE = 3


class AlphaCurve(IntEnum):
    LINEAR = 0
    COSINE = 1
    SIGMOID_GENTLE = 2
    SIGMOID = 3
    SIGMOID_SHARP = 4


# Steepness of the normalised logistic curves.
SIGMOID_STEEPNESS: dict[AlphaCurve, float] = {
    AlphaCurve.SIGMOID_GENTLE: 6.0,
    AlphaCurve.SIGMOID: 12.0,
    AlphaCurve.SIGMOID_SHARP: 24.0,
}


class Style(IntEnum):
    """Germination style: which blend operator and which curve the initial blend-in uses."""

    LINEAR_ADD = 0
    LINEAR_MULTIPLY = 1
    SIGMOID_ADD = 2
    GATED_GATE = 3

    @property
    def algorithm(self) -> BlendAlgorithm:
        return {
            Style.LINEAR_ADD: BlendAlgorithm.ADD,
            Style.LINEAR_MULTIPLY: BlendAlgorithm.MULTIPLY,
            Style.SIGMOID_ADD: BlendAlgorithm.ADD,
            Style.GATED_GATE: BlendAlgorithm.GATE,
        }[self]

    @property
    def curve(self) -> AlphaCurve:
        return AlphaCurve.SIGMOID if self is Style.SIGMOID_ADD else AlphaCurve.LINEAR


class Tempo(IntEnum):
    """Blend-in duration choice; `epochs` is the ramp length."""

    FAST = 0
    STANDARD = 1
    SLOW = 2

    @property
    def epochs(self) -> int:
        return (3, 5, 8)[self]


class AlphaTarget(IntEnum):
    HALF = 0
    SEVENTY = 1
    FULL = 2

    @property
    def alpha(self) -> float:
        return (0.5, 0.7, 1.0)[self]


class AlphaSpeed(IntEnum):
    """Ramp length (ticks) of a re-target or a prune's blend-out; INSTANT jumps at once."""

    INSTANT = 0
    FAST = 1
    MEDIUM = 2
    SLOW = 3

    @property
    def ticks(self) -> int:
        return (0, 3, 5, 8)[self]


@dataclass(frozen=True)
class FactoredAction:
    """One decision, decoded from the policy's MultiDiscrete action.

    `slot` is None for WAIT. Heads that do not matter for `op` keep their canonical defaults.
    """

    op: Op
    slot: str | None = None
    blueprint: BlueprintId = Blueprint.NOOP
    style: Style = Style.SIGMOID_ADD
    tempo: Tempo = Tempo.STANDARD
    alpha_target: AlphaTarget = AlphaTarget.FULL
    alpha_speed: AlphaSpeed = AlphaSpeed.INSTANT
    alpha_curve: AlphaCurve = AlphaCurve.LINEAR


# Which non-joint heads each op reads (DOMAIN.md "causal relevance"). Heads outside this set neither
# change what the env does nor enter the log-probability or the entropy. SET_ALPHA_TARGET does not read
# `style`: a seed's blend operator is fixed at germination in esper-ray.
HEAD_NAMES: tuple[str, ...] = ("op_slot", "blueprint", "style", "tempo", "alpha_target", "alpha_speed", "alpha_curve")
HEAD_SIZES_AFTER_JOINT: tuple[int, ...] = (
    MAX_BLUEPRINTS,
    len(Style),
    len(Tempo),
    len(AlphaTarget),
    len(AlphaSpeed),
    len(AlphaCurve),
)

RELEVANT_HEADS: dict[Op, frozenset[str]] = {
    Op.WAIT: frozenset(),
    Op.GERMINATE: frozenset({"blueprint", "style", "tempo", "alpha_target"}),
    Op.SET_ALPHA_TARGET: frozenset({"alpha_target", "alpha_speed", "alpha_curve"}),
    Op.PRUNE: frozenset({"alpha_speed", "alpha_curve"}),
    Op.FOSSILIZE: frozenset(),
    Op.ADVANCE: frozenset(),
}


MAX_SLOTS = 16
"""Slots the policy's spaces are sized for, whatever the host: a host with fewer has its other positions absent
(zero features, blueprint id NONE, every joint entry masked); a host with more is refused (check_slot_count)."""


def check_slot_count(host: str, num_slots: int) -> None:
    """ValueError in one line when a host has more slots than the policy's spaces hold."""
    if num_slots > MAX_SLOTS:
        raise ValueError(
            f"host {host!r} has {num_slots} slots; the policy holds at most MAX_SLOTS={MAX_SLOTS} "
            "(choose fewer with `slots`)"
        )


# The joint (op, slot) head: index 0 is WAIT (which needs no slot); then one entry per (op, slot position) for the
# other ops, op-major: 1 + (op - 1) * MAX_SLOTS + slot_index. Sized for MAX_SLOTS, so an index means the same
# (op, position) on every host.
SLOTTED_OPS: tuple[Op, ...] = tuple(op for op in Op if op is not Op.WAIT)


def joint_size() -> int:
    return 1 + len(SLOTTED_OPS) * MAX_SLOTS


def encode_joint(op: Op, slot_index: int | None) -> int:
    if op is Op.WAIT:
        return 0
    if slot_index is None or not 0 <= slot_index < MAX_SLOTS:
        raise ValueError(f"op {op.name} needs a slot index in [0, {MAX_SLOTS}), got {slot_index}")
    return 1 + (op - 1) * MAX_SLOTS + slot_index


def decode_joint(index: int) -> tuple[Op, int | None]:
    if not 0 <= index < joint_size():
        raise ValueError(f"joint op/slot index {index} is outside [0, {joint_size()})")
    if index == 0:
        return Op.WAIT, None
    op_offset, slot_index = divmod(index - 1, MAX_SLOTS)
    return Op(op_offset + 1), slot_index
