"""Families: lists of hosts and tasks one training run draws its episodes from (docs/families.md).

A controller trained on one host learns that host's best plan, which a sweep finds as well; one that is to grow hosts
it never saw must be trained on many. A family is a named list of members, each a set of EnvConfig overrides (task,
host_preset, slots, max_epochs, train_samples, ...); a run with `family` set draws one member per episode
(env/morphogenetic_env.py) and applies its overrides to the run's own env settings.

Built in: `grow-family` (training for the slot-shared policy: 2-7 slots, three data sets, runs of 15-35 epochs, a data
budget) and `grow-held-out` (a data set none of it trains on); `digits-family` (training: digits-impaired variants of
other widths, kernels, block counts, data budgets and run lengths, and small synthetic ones), `digits-family-3slot`
(its members with the default 3 slots), and two held-out families of hosts no training member uses, each with a
data set none trains on: `digits-held-out` (hosts with room to spare, where growth adds little) and
`digits-held-out-starved` (starved as the training hosts are, where it pays). Their hosts and data sets register
here, as plug-ins would (not `builtin`: the built-in tasks and hosts stay the ones the README lists).

This module imports nothing from esper_ray but the registry; EnvConfig validates the members' overrides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from esper_ray.contracts import registry

RUN_KEYS = frozenset(
    {
        "family",
        "plugins",
        "seed",
        "shard",
        "num_shards",
        "gamma",
        "reward_mode",
        "reward_family",
        "device",
        "amp",
        "cudnn_deterministic",
        "cuda_graphs",
        "graph_validation",
    }
)
"""Env settings a member may not override: the run's, the same for every episode (its seeds, its shards, PPO's
discount and reward, the machine)."""


@dataclass(frozen=True)
class Member:
    name: str
    """The member's name, which episode infos and metrics carry (`family_member`)."""
    env: Mapping[str, Any] = field(default_factory=dict)
    """EnvConfig overrides applied over the run's env settings for this member's episodes."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"family member name {self.name!r}: must be a non-empty string without '/'")
        if not isinstance(self.env, Mapping):
            raise ValueError(f"family member {self.name!r}: env={self.env!r}; must be a mapping of env settings")
        object.__setattr__(self, "env", dict(self.env))

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted((k, repr(v)) for k, v in self.env.items()))))


_FAMILIES: dict[str, tuple[Member, ...]] = {}
_BUILTIN: set[str] = set()


def register_family(
    name: str, members: Iterable[Member | Mapping[str, Any]], *, builtin: bool = False
) -> tuple[Member, ...]:
    """Register the family `name`: members as Member or {"name": ..., "env": {...}}. Their settings are checked when a
    run names the family (EnvConfig), where every plug-in's hosts and tasks are registered."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"family name {name!r}: must be a non-empty string")
    if isinstance(members, (str, Mapping)):
        raise ValueError(f"family {name!r}: members={members!r}; give a list of members")
    parsed = []
    for m in members:
        if isinstance(m, Mapping):
            unknown = sorted(set(m) - {"name", "env"})
            if unknown or "name" not in m:
                raise ValueError(f"family {name!r}: member {dict(m)!r}; a member is {{name: ..., env: {{...}}}}")
            m = Member(m["name"], m.get("env", {}))
        if not isinstance(m, Member):
            raise ValueError(f"family {name!r}: member {m!r}; expected a Member or a mapping {{name, env}}")
        parsed.append(m)
    if not parsed:
        raise ValueError(f"family {name!r}: has no members")
    names = [m.name for m in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"family {name!r}: names a member twice: {names}")
    entry = tuple(parsed)
    if name in _FAMILIES and _FAMILIES[name] != entry:
        raise ValueError(f"family {name!r} is registered already; pick another name")
    _FAMILIES[name] = entry
    if builtin:
        _BUILTIN.add(name)
    return entry


def family(name: str) -> tuple[Member, ...]:
    """The members of family `name`; an unknown name lists the registered families."""
    if name not in _FAMILIES:
        raise ValueError(
            f"family={name!r}: unknown; choose one of {family_names()} (or register one: docs/families.md)"
        )
    return _FAMILIES[name]


def family_names(*, builtin_only: bool = False) -> list[str]:
    return [n for n in _FAMILIES if n in _BUILTIN or not builtin_only]


# ------------------------------------------------------------------------------------------------- built-ins
def _cnn(name: str, **shape: Any) -> None:
    registry.register_host(name, "esper_ray.morpho.host:CNNHost.from_description", description=shape)


def _register_builtins() -> None:
    digits = {"in_channels": 1, "image_size": 8, "blocks": 3, "pool_layers": 2}
    # digits-impaired is 2/4/8 channels of 1x1 kernels; each variant changes one or two things about it
    _cnn("digits-impaired-wide", **digits, base_channels=4, kernel_size=1)
    _cnn("digits-impaired-k3", **digits, base_channels=2, kernel_size=3)
    _cnn("digits-impaired-2b", **{**digits, "blocks": 2}, base_channels=2, kernel_size=1)  # slots r0c0, r0c1
    _cnn("digits-impaired-4b", **{**digits, "blocks": 4}, base_channels=2, kernel_size=1)  # slots r0c0..r0c3
    _cnn(
        "synthetic-small", in_channels=3, image_size=32, base_channels=2, blocks=3, kernel_size=1, pool_layers=3
    )  # starved too
    # held out: a width and kernel no training member has, and a data set none trains on
    _cnn("digits-impaired-k5", **digits, base_channels=3, kernel_size=5)
    registry.register_task(
        "synthetic-gray",
        "esper_ray.data.datasets:synthetic_gray_task",
        hosts=("synthetic-gray",),
        batch_size=64,
        host_lr=0.05,
    )
    _cnn("synthetic-gray", in_channels=1, image_size=16, base_channels=3, blocks=3, kernel_size=3, pool_layers=3)

    # held out and starved as the training members are (1x1 kernels, 2-3 channels): slot counts and shapes no training
    # member has, and the grey data set; each kept because a baseline grew it >= 5 points above no growth on seeds
    # 100-101 (docs/results/transfer_starved/README.md says which candidates failed that rule)
    _cnn("digits-impaired-5b", **{**digits, "blocks": 5}, base_channels=2, kernel_size=1)
    _cnn("digits-impaired-6b", **{**digits, "blocks": 6}, base_channels=2, kernel_size=1)
    _cnn("digits-impaired-k3-2b", **{**digits, "blocks": 2}, base_channels=2, kernel_size=3)
    _cnn("synthetic-3c", in_channels=3, image_size=32, base_channels=3, blocks=3, kernel_size=1, pool_layers=3)
    _cnn(
        "synthetic-gray-starved", in_channels=1, image_size=16, base_channels=2, blocks=3, kernel_size=1, pool_layers=3
    )

    # grow-family's own hosts (issue 75): 5 and 7 slots, two more shapes of synthetic data, and a third data set
    _cnn("digits-impaired-5b-w3", **{**digits, "blocks": 5}, base_channels=3, kernel_size=1)
    _cnn("digits-impaired-7b", **{**digits, "blocks": 7}, base_channels=2, kernel_size=1)
    _cnn("synthetic-6b", in_channels=3, image_size=32, base_channels=2, blocks=6, kernel_size=1, pool_layers=3)
    patterns = {"in_channels": 2, "image_size": 12, "kernel_size": 1, "pool_layers": 2}
    _cnn("patterns-4b", **patterns, base_channels=2, blocks=4)
    _cnn("patterns-2b", **patterns, base_channels=3, blocks=2)
    registry.register_task(
        "patterns", "esper_ray.data.datasets:patterns_task", hosts=("patterns-4b",), batch_size=64, host_lr=0.05
    )
    # grow-held-out's: a data set no training member uses, on 2, 3 and 5 slots
    textures = {"in_channels": 3, "image_size": 20, "kernel_size": 1, "pool_layers": 2}
    _cnn("textures-3b", **textures, base_channels=2, blocks=3)
    _cnn("textures-5b", **textures, base_channels=2, blocks=5)
    _cnn("textures-2b-wide", **textures, base_channels=3, blocks=2)
    registry.register_task(
        "textures", "esper_ray.data.datasets:textures_task", hosts=("textures-3b",), batch_size=64, host_lr=0.05
    )

    impaired = {"task": "digits-impaired"}
    synthetic = {
        "task": "synthetic",
        "host_preset": "synthetic-small",
        "synthetic_size": 500,
        "synthetic_held_out": 200,
        "batch_size": 64,
        "host_lr": 0.05,
        "val_batch_size": 1_024,
    }
    three_slots = (
        Member("impaired", impaired),
        Member("impaired-wide", {**impaired, "host_preset": "digits-impaired-wide"}),
        Member("impaired-k3", {**impaired, "host_preset": "digits-impaired-k3"}),
        Member("impaired-400", {**impaired, "train_samples": 400}),  # a data budget: a third of the training split
        Member("impaired-long", {**impaired, "max_epochs": 35}),
        Member("synthetic-small", synthetic),
    )
    register_family("digits-family-3slot", three_slots, builtin=True)
    register_family(
        "digits-family",
        three_slots
        + (
            Member("impaired-2b", {**impaired, "host_preset": "digits-impaired-2b", "slots": ["r0c0", "r0c1"]}),
            Member(
                "impaired-4b",
                {
                    **impaired,
                    "host_preset": "digits-impaired-4b",
                    "slots": ["r0c0", "r0c1", "r0c2", "r0c3"],
                    "max_epochs": 20,
                },
            ),
        ),
        builtin=True,
    )

    def slots(count: int) -> list[str]:
        return [f"r0c{i}" for i in range(count)]

    pattern_data = {"task": "patterns", "synthetic_size": 800, "synthetic_held_out": 200}
    register_family(
        "grow-family",
        (
            Member("impaired", impaired),
            Member("impaired-wide", {**impaired, "host_preset": "digits-impaired-wide"}),
            Member("impaired-400", {**impaired, "train_samples": 400}),  # a data budget
            Member(
                "impaired-2b",
                {**impaired, "host_preset": "digits-impaired-2b", "slots": slots(2), "max_epochs": 15},
            ),
            Member(
                "impaired-4b",
                {**impaired, "host_preset": "digits-impaired-4b", "slots": slots(4), "max_epochs": 20},
            ),
            Member(
                "impaired-5b-w3",
                {**impaired, "host_preset": "digits-impaired-5b-w3", "slots": slots(5), "max_epochs": 30},
            ),
            Member(
                "impaired-7b",
                {**impaired, "host_preset": "digits-impaired-7b", "slots": slots(7), "max_epochs": 35},
            ),
            Member("synthetic-small", synthetic),
            Member(
                "synthetic-6b",
                {**synthetic, "host_preset": "synthetic-6b", "slots": slots(6), "max_epochs": 30},
            ),
            Member("patterns-4b", {**pattern_data, "slots": slots(4), "max_epochs": 20}),
            Member(
                "patterns-2b-long",
                {**pattern_data, "host_preset": "patterns-2b", "slots": slots(2), "max_epochs": 35},
            ),
        ),
        builtin=True,
    )
    texture_data = {"task": "textures", "synthetic_size": 800, "synthetic_held_out": 300}
    register_family(
        "grow-held-out",
        (
            Member("textures-3b", texture_data),
            Member("textures-5b", {**texture_data, "host_preset": "textures-5b", "slots": slots(5)}),
            Member("textures-2b-wide", {**texture_data, "host_preset": "textures-2b-wide", "slots": slots(2)}),
        ),
        builtin=True,
    )
    register_family(
        "digits-held-out",
        (
            Member("digits", {"task": "digits"}),  # the digits host: 3x3 kernels, 8/16/32 channels
            Member("impaired-k5", {**impaired, "host_preset": "digits-impaired-k5"}),
            Member("synthetic-gray", {"task": "synthetic-gray", "synthetic_size": 1_000, "synthetic_held_out": 300}),
        ),
        builtin=True,
    )
    register_family(
        "digits-held-out-starved",
        (
            Member(
                "impaired-5b", {**impaired, "host_preset": "digits-impaired-5b", "slots": [f"r0c{i}" for i in range(5)]}
            ),
            Member(
                "impaired-6b", {**impaired, "host_preset": "digits-impaired-6b", "slots": [f"r0c{i}" for i in range(6)]}
            ),
            Member("impaired-k3-2b", {**impaired, "host_preset": "digits-impaired-k3-2b", "slots": ["r0c0", "r0c1"]}),
            Member("synthetic-3c", {**synthetic, "host_preset": "synthetic-3c"}),
            Member(
                "gray-starved",
                {
                    "task": "synthetic-gray",
                    "host_preset": "synthetic-gray-starved",
                    "synthetic_size": 1_000,
                    "synthetic_held_out": 300,
                },
            ),
        ),
        builtin=True,
    )


_register_builtins()
