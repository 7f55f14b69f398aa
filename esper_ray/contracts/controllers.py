"""Who makes the growth decisions in a run or an A/B arm, and what a `fixed` arm plants."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from esper_ray.contracts.actions import (
    BlueprintId,
    Style,
    Tempo,
    parse_blueprint,
    registered_blueprints,
    topology_blueprints,
)


class ControllerKind(str, Enum):
    PPO = "ppo"
    """The policy trained with PPO (the only kind that trains)."""
    HEURISTIC = "heuristic"
    """The rule-based controller of the original (DOMAIN.md section 12)."""
    NONE = "none"
    """Always WAIT: the host as it is, never grown. The baseline every growth claim is read against."""
    RANDOM = "random"
    """Uniform over the legal values of every head."""
    FIXED = "fixed"
    """Plants one named seed (blueprint, slot) at the first step and fossilizes it as early as the lifecycle and
    gates allow, then waits: the host "born bigger", the baseline a growth claim at equal size is read against.
    Several named seeds (a list) are planted in order, each as soon as the env allows (FixedPlan)."""
    CHECKPOINT = "checkpoint"
    """An A/B arm only: the greedy policy of an already trained checkpoint, evaluated without training (frozen)."""
    SEARCH = "search"
    """An A/B arm only: per host, a search over fixed plans at a stated budget of host runs
    (experiments/plan_search.py)."""

    @classmethod
    def parse(cls, value: object, where: str = "controller") -> ControllerKind:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{where}={value!r}: unknown controller; choose one of {[k.value for k in cls]}") from None


@dataclass(frozen=True)
class FixedSeed:
    """The seed a `fixed` controller plants: which blueprint in which slot, and how it blends in.

    The blend always targets alpha 1.0: a seed blended to 0.5 or 0.7 never reaches HOLDING (gate G3), so it
    could never be fossilized.
    """

    blueprint: BlueprintId
    slot: str
    style: Style = Style.SIGMOID_ADD
    """Blend operator and curve of the initial blend-in (the heuristic's default)."""
    tempo: Tempo = Tempo.STANDARD
    """Epochs of the blend-in ramp: fast 3, standard 5, slow 8."""

    @property
    def label(self) -> str:
        """`conv_heavy@r0c1`, as reports name the arm's seed."""
        return f"{self.blueprint.key}@{self.slot}"

    @classmethod
    def from_mapping(
        cls, mapping: object, where: str, *, topology: str | None, slots: Sequence[str] | None
    ) -> FixedSeed:
        """Parse `{blueprint: conv_heavy, slot: r0c1, style: sigmoid_add, tempo: standard}`; style and tempo are
        optional. ValueError naming `where`, the key, its value and what is allowed. `topology` and `slots` None: a
        plan as a finished run recorded it, read without its host (any blueprint name registered in this process, a
        plug-in's once its module is imported, any slot)."""
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{where}={mapping!r}: must be a mapping such as {{blueprint: conv_heavy, slot: r0c1}}")
        known = ("blueprint", "slot", "style", "tempo")
        unknown = sorted(set(mapping) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {list(known)}")
        missing = [k for k in ("blueprint", "slot") if k not in mapping]
        if missing:
            raise ValueError(
                f"{where}: missing {missing}; a fixed arm names a blueprint and a slot, e.g. "
                f"{{blueprint: conv_heavy, slot: r0c1}}"
            )
        try:
            allowed = topology_blueprints(topology) if topology is not None else registered_blueprints()
            blueprint = parse_blueprint(mapping["blueprint"], allowed, f"{topology or 'any'} hosts")
        except ValueError as err:
            raise ValueError(f"{where}.blueprint: {err}") from None
        if slots is not None and mapping["slot"] not in slots:
            raise ValueError(f"{where}.slot={mapping['slot']!r}: not an enabled slot; enabled slots: {list(slots)}")
        return cls(
            blueprint,
            str(mapping["slot"]),
            _enum(Style, mapping.get("style", "sigmoid_add"), f"{where}.style"),
            _enum(Tempo, mapping.get("tempo", "standard"), f"{where}.tempo"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "blueprint": self.blueprint.key,
            "slot": self.slot,
            "style": self.style.name.lower(),
            "tempo": self.tempo.name.lower(),
        }


@dataclass(frozen=True)
class FixedPlan:
    """What a `fixed` controller plants: one seed, or several in order, each in a slot of its own. The first goes
    in at the first step, each next one as soon as the env allows a germination (one seed develops at a time: once
    the one before has left TRAINING), and each is fossilized as early as allowed."""

    seeds: tuple[FixedSeed, ...]

    @property
    def label(self) -> str:
        """`conv_heavy@r0c1`, or `conv_heavy@r0c1+bottleneck@r0c2` for two seeds."""
        return "+".join(s.label for s in self.seeds)

    def to_dict(self) -> dict[str, Any] | list[dict[str, Any]]:
        """One seed as its mapping (as experiment files and results have always named it), several as a list."""
        return self.seeds[0].to_dict() if len(self.seeds) == 1 else [s.to_dict() for s in self.seeds]

    @classmethod
    def from_mapping(cls, value: object, where: str, *, topology: str | None, slots: Sequence[str] | None) -> FixedPlan:
        """`{blueprint: conv_heavy, slot: r0c1}`, or a list of such mappings in distinct slots. ValueError naming
        `where` (with the list index), the key, its value and what is allowed."""
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if not value:
                raise ValueError(f"{where}=[]: name at least one seed, e.g. [{{blueprint: conv_heavy, slot: r0c1}}]")
            seeds = tuple(
                FixedSeed.from_mapping(v, f"{where}[{i}]", topology=topology, slots=slots) for i, v in enumerate(value)
            )
        else:
            seeds = (FixedSeed.from_mapping(value, where, topology=topology, slots=slots),)
        named = [s.slot for s in seeds]
        twice = sorted({s for s in named if named.count(s) > 1})
        if twice:
            raise ValueError(f"{where}: slot(s) {twice} named more than once; each seed needs a slot of its own")
        return cls(seeds)


def _enum(kind: type[Style] | type[Tempo], value: object, where: str) -> Any:
    names = [m.name.lower() for m in kind]
    if not isinstance(value, str) or value.lower() not in names:
        raise ValueError(f"{where}={value!r}: choose one of {names}")
    return kind[value.upper()]
