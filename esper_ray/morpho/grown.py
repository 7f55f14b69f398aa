"""The grown network: the host with the seeds a run grew, each fixed at its final alpha. No lifecycle, no Ray.

A MorphogeneticModel carries the whole lifecycle (stages, alpha ramps, seed optimizers, counterfactual passes);
the network a run leaves behind needs none of it. `GrownNetwork` is the committed model of the run's end
(docs/design.md, "The end of a host run"): the host plus every FOSSILIZED seed, blended in with its operator at
the alpha it ended with. Seeds still on probation (GERMINATED, TRAINING, BLENDING, HOLDING) are dropped, as are
pruned seeds (their module is gone).

The forward calls the model's own `blend`, so in eval mode on the same device and precision it gives the logits
the env measured the run's final (committed) test accuracy with. Files written before the end of a run meant
this also hold BLENDING or HOLDING seeds; they still load (KEPT_STAGES).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from esper_ray.contracts.actions import BlendAlgorithm, Blueprint, BlueprintId, blueprint_id
from esper_ray.contracts.host import HostConfig, Topology
from esper_ray.contracts.stages import Stage
from esper_ray.contracts.transformer_host import TransformerHostConfig
from esper_ray.morpho.blend import GatedBlend, blend
from esper_ray.morpho.blueprints import build_seed, count_params, resolve_blueprint
from esper_ray.morpho.host import CNNHost
from esper_ray.morpho.hosts import Host, rebuild_host
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.slot import SeedSlot
from esper_ray.morpho.transformer import TransformerHost

KEPT_STAGES = frozenset({Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})
"""Stages a saved seed may have: FOSSILIZED, or (in files written before the committed model) BLENDING/HOLDING."""
CONTENTS = (
    "the committed model: the host and every FOSSILIZED seed, each at the alpha the run ended with; seeds still on "
    "probation when the run ended (GERMINATED, TRAINING, BLENDING, HOLDING) and pruned seeds are left out"
)


@dataclass(frozen=True)
class GrownSeedSpec:
    """What the architecture file says about one kept seed; enough to rebuild its module before loading weights."""

    slot: str
    blueprint: BlueprintId
    """A built-in blueprint, or a plug-in's name (registered once load_grown has imported the plug-ins passed)."""
    blend: BlendAlgorithm
    alpha: float
    """The blend amplitude the seed is fixed at, in (0, 1]."""
    stage: Stage
    """Its lifecycle stage when the run ended (FOSSILIZED: kept for good; BLENDING/HOLDING: still on trial)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "blueprint": self.blueprint.key,
            "blend": self.blend.name.lower(),
            "alpha": self.alpha,
            "stage": self.stage.name,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> GrownSeedSpec:
        def field(key: str, parse: Any, allowed: str) -> Any:
            if key not in raw:
                raise ValueError(f"{where}: seed entry {dict(raw)} has no {key!r} ({allowed})")
            try:
                return parse(raw[key])
            except (KeyError, ValueError, TypeError):
                raise ValueError(
                    f"{where}: seed {raw.get('slot')!r} has {key}={raw[key]!r}; expected {allowed}"
                ) from None

        alpha = field("alpha", float, "a number in (0, 1]")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"{where}: seed {raw.get('slot')!r} has alpha={alpha}; expected a number in (0, 1]")
        return cls(
            slot=field("slot", str, "a slot name such as 'r0c1'"),
            blueprint=field("blueprint", _blueprint_name, "a blueprint name (no ':')"),
            blend=field(
                "blend", lambda v: BlendAlgorithm[str(v).upper()], f"one of {[a.name.lower() for a in BlendAlgorithm]}"
            ),
            alpha=alpha,
            stage=field("stage", _kept_stage, f"one of {sorted(s.name for s in KEPT_STAGES)}"),
        )


def _blueprint_name(name: Any) -> BlueprintId:
    """A blueprint read from a file: a built-in name (in any case, as files have always held them), else a name a
    plug-in may register; only a name, never an import string (load_grown checks it is registered before building)."""
    if isinstance(name, str) and name.upper() in Blueprint.__members__ and name.lower() != "noop":
        return Blueprint[name.upper()]
    if not isinstance(name, str) or not name or ":" in name or name.lower() == "noop" or len(name) > 100:
        raise ValueError(name)
    return blueprint_id(name)


def _kept_stage(name: Any) -> Stage:
    stage = Stage[str(name)]
    if stage not in KEPT_STAGES:
        raise ValueError(f"stage {stage.name} is never kept")
    return stage


class GrownSeed(nn.Module):
    """One kept seed: `seed` (and `gate` for the gated blend) applied to the host's features at a fixed alpha."""

    def __init__(self, spec: GrownSeedSpec, seed: nn.Module, gate: GatedBlend | None) -> None:
        super().__init__()
        if (gate is None) != (spec.blend is not BlendAlgorithm.GATE):
            raise ValueError(
                f"slot {spec.slot}: blend {spec.blend.name.lower()} {'needs' if gate is None else 'takes no'} gate"
            )
        self.spec = spec
        self.seed = seed
        self.gate = gate
        # float32 like the env's alphas (MorphogeneticModel.current_alphas), so the product alpha * x is the same
        self.register_buffer("alpha", torch.tensor(spec.alpha, dtype=torch.float32), persistent=False)

    def forward(self, host: torch.Tensor) -> torch.Tensor:
        return blend(self.spec.blend, host, self.seed(host), host, self.alpha, self.gate)


class GrownNetwork(nn.Module):
    """The host with its kept seeds. `forward(x)` takes what the host takes (normalised images [B, C, H, W], or
    token ids [B, T]) and returns its logits ([B, classes], or [B, T, vocab])."""

    def __init__(self, host: Host, seeds: Mapping[str, GrownSeed], plugins: Sequence[str] = ()) -> None:
        super().__init__()
        unknown = sorted(set(seeds) - set(host.slot_ids))
        if unknown:
            raise ValueError(f"seeds in slots {unknown}, which this host does not have; its slots: {host.slot_ids}")
        self.host = host
        self.seeds = nn.ModuleDict(dict(seeds))
        self.plugins = tuple(plugins)
        """The plug-in modules that register the host's and the seeds' parts (recorded in architecture.json)."""

    @property
    def topology(self) -> Topology:
        return self.host.topology

    @property
    def seed_specs(self) -> list[GrownSeedSpec]:
        return [s.spec for s in self.seeds.values()]  # type: ignore[misc]

    @property
    def host_params(self) -> int:
        return count_params(self.host)

    def seed_params(self, slot: str) -> int:
        return count_params(self.seeds[slot])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def at_slot(slot_id: str, h: torch.Tensor) -> torch.Tensor:
            return self.seeds[slot_id](h) if slot_id in self.seeds else h

        return self.host(x, at_slot)


def kept_alpha(slot: SeedSlot) -> float | None:
    """The alpha a slot's seed is kept at in the grown network, or None when the seed is left out: only fossils
    are kept (MorphogeneticModel.committed_alphas)."""
    if slot.seed is None or slot.stage is not Stage.FOSSILIZED or slot.alpha.alpha <= 0.0:
        return None
    return float(slot.alpha.alpha)


def grown_from(model: MorphogeneticModel, plugins: Sequence[str] = ()) -> GrownNetwork:
    """A copy (on the CPU, in eval mode) of the committed model (host and fossils), without its lifecycle.
    `plugins`: the run's plug-in modules, recorded for a reader (load_grown imports only those its caller passes)."""
    seeds = {}
    for slot in model.seed_slots():
        alpha = kept_alpha(slot)
        if alpha is None:
            continue
        assert slot.blueprint is not None, f"slot {slot.slot_id}: a seed without a blueprint"
        spec = GrownSeedSpec(slot.slot_id, slot.blueprint, slot.algorithm, alpha, slot.stage)
        seeds[slot.slot_id] = GrownSeed(spec, copy.deepcopy(slot.seed), copy.deepcopy(slot.gate))  # type: ignore[arg-type]
    network = GrownNetwork(copy.deepcopy(model.host), seeds, plugins)
    return network.to("cpu", memory_format=torch.contiguous_format).eval()


def host_config_of(host: Host) -> dict[str, Any]:
    """The host's own JSON description (HostModule.describe)."""
    return host.describe()


def build_host_from_config(topology: Topology, config: Mapping[str, Any], host_name: str | None = None) -> Host:
    """A fresh host from its description: through the registry when the file names its host (`host_name`), else
    (files written before the registry) from the fields of HostConfig for a CNN, TransformerHostConfig for a
    transformer."""
    if host_name is not None:
        host = rebuild_host(host_name, dict(config))
        if host.topology is not topology:
            raise ValueError(f"host {host_name!r} is a {host.topology.value} host; the file says {topology.value}")
        return host
    if topology is Topology.CNN:
        return CNNHost(HostConfig(**config))
    if topology is Topology.TRANSFORMER:
        return TransformerHost(TransformerHostConfig(**config))
    raise ValueError(f"a {topology.value} host is rebuilt by its registered name, and this file names none")


def empty_grown_network(
    topology: Topology,
    host_config: Mapping[str, Any],
    specs: Sequence[GrownSeedSpec],
    host_name: str | None = None,
    plugins: Sequence[str] = (),
) -> GrownNetwork:
    """The network's modules, freshly initialised, ready for `load_state_dict` of a saved one."""
    host = build_host_from_config(topology, host_config, host_name)
    seeds = {}
    for spec in specs:
        if spec.slot in seeds:
            raise ValueError(f"two seeds in slot {spec.slot}")
        channels = host.slot_channels(spec.slot)
        blueprint = resolve_blueprint(spec.blueprint, topology)
        multiply = spec.blend is BlendAlgorithm.MULTIPLY  # its parameters differ (build_seed)
        seed = build_seed(blueprint, channels, topology, inference_only=True, multiply=multiply)
        gate = GatedBlend(channels, topology) if spec.blend is BlendAlgorithm.GATE else None
        seeds[spec.slot] = GrownSeed(spec, seed, gate)
    return GrownNetwork(host, seeds, plugins)
