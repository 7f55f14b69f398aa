"""Floating-point operations of host and seeds, counted from the modules' shapes, and an episode's tally.

What counts (forward, per input row: one image, or one sequence of `seq_len` tokens):
    convolution   2 * Cin / groups * Cout * kh * kw * Hout * Wout
    linear        2 * in * out per row it is applied to (per image after pooling; per token in a transformer)
    attention     the two matmuls Q K^T and A V, 2 * T * T * C each per sequence (the full T x T, as torch's
                  FlopCounterMode counts scaled_dot_product_attention)
Norms, activations, pooling, softmax, blends and embedding lookups are left out: elementwise work, small
against the matmuls, and left out of the usual counts too (Kaplan et al. 2020, "Scaling laws", section 2.1).
Training a module costs 3x its forward (the backward pass is 2x: gradients of inputs and of weights); a
module whose parameters are frozen (a seed whose prune is ramping alpha down) costs its forward only, since
no gradient reaches it (seeds read the host's features detached).

The counts come from one forward of a single row through a copy on the meta device (shapes only, no
arithmetic), with hooks on the counted module types; they are cached per host preset and per seed shape. A plug-in's
seed (a blueprint under a name of its own) may be built of anything, so its cost is measured instead: built on the
CPU and run on one row under torch's FlopCounterMode, which counts every matmul and convolution whatever module
makes it (seed_cost).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from esper_ray.contracts.actions import Blueprint, BlueprintId, PluginBlueprint
from esper_ray.contracts.host import Topology
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.blend import GatedBlend
from esper_ray.morpho.blueprints import build_seed, count_params
from esper_ray.morpho.hosts import build_host
from esper_ray.morpho.slot import SeedSlot
from esper_ray.morpho.transformer import CausalSelfAttention
from esper_ray.morpho.transformer_blueprints import AttentionSeed

ATTENTION_MODULES: tuple[type[nn.Module], ...] = (CausalSelfAttention, AttentionSeed)
"""Modules whose forward calls scaled_dot_product_attention on [B, T, C] inputs (not a module: hooks miss it)."""
TRAIN_FACTOR = 3
"""Forward + backward of a trained module, in forward passes."""


def _add_flops(tally: list[int]) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            tally[0] += 2 * output.numel() * (module.in_channels // module.groups) * kh * kw
        elif isinstance(module, nn.Linear):
            tally[0] += 2 * output.numel() * module.in_features  # output [rows..., out]
        elif isinstance(module, ATTENTION_MODULES):
            b, t, c = inputs[0].shape
            tally[0] += 2 * (2 * b * t * t * c)

    return hook


def _counting(module: nn.Module, run: Callable[[], object]) -> int:
    tally = [0]
    handles = [m.register_forward_hook(_add_flops(tally)) for m in module.modules()]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return tally[0]


@dataclass(frozen=True)
class HostFlops:
    forward: int
    """Forward FLOPs of the host alone, per row."""
    before_slot: dict[str, int]
    """Per injection point: forward FLOPs of the host before it (the prefix a fused validation shares)."""
    order: tuple[str, ...]
    """Injection points in forward order (r0c0, r1c0, r0c1, ... for a CNN)."""


@functools.cache
def host_flops(preset: str) -> HostFlops:
    """Forward FLOPs per row of a host preset, and how many of them come before each injection point."""
    with torch.device("meta"):
        host = build_host(preset)
        row = host.example_input().to("meta")  # the host's own input row: [1, C, H, W] images, [1, T] tokens, ...
    tally = [0]
    before: dict[str, int] = {}

    def at_slot(slot_id: str, h: torch.Tensor) -> torch.Tensor:
        before[slot_id] = tally[0]
        return h

    handles = [m.register_forward_hook(_add_flops(tally)) for m in host.modules()]
    try:
        with torch.no_grad():
            host(row, at_slot)
    finally:
        for h in handles:
            h.remove()
    return HostFlops(forward=tally[0], before_slot=before, order=tuple(before))


@functools.cache
def host_params(preset: str) -> int:
    """Parameters of a host preset (built on the meta device: shapes only)."""
    with torch.device("meta"):
        return count_params(build_host(preset))


@functools.cache
def seed_flops(blueprint: BlueprintId, topology: Topology, feature_shape: tuple[int, ...]) -> int:
    """Forward FLOPs per row of a seed on features of `feature_shape` ((C, H, W) or (T, C)). flex_attention does
    the attention seed's arithmetic, so it is counted as one; a plug-in's seed is measured (seed_cost)."""
    if isinstance(blueprint, PluginBlueprint):
        return seed_cost(blueprint, topology, feature_shape)[1]
    counted = Blueprint.ATTENTION if blueprint is Blueprint.FLEX_ATTENTION else blueprint
    with torch.device("meta"):
        seed = build_seed(counted, _channels(topology, feature_shape), topology)
    x = torch.zeros(1, *feature_shape, device="meta")
    return _counting(seed, lambda: seed(x))


@functools.cache
def seed_cost(blueprint: BlueprintId, topology: Topology, feature_shape: tuple[int, ...]) -> tuple[int, int]:
    """(parameters, forward FLOPs per row) a seed adds at a slot of `feature_shape`: a built-in's counted on the meta
    device as seed_flops counts it; a plug-in's measured on the CPU (sum of its parameters' numel; FlopCounterMode
    over one forward of a zero row), under a forked RNG so that building it draws nothing from the run's generator."""
    channels = _channels(topology, feature_shape)
    if not isinstance(blueprint, PluginBlueprint):
        counted = Blueprint.ATTENTION if blueprint is Blueprint.FLEX_ATTENTION else blueprint
        with torch.device("meta"):
            params = count_params(build_seed(counted, channels, topology))
        return params, seed_flops(blueprint, topology, feature_shape)
    with torch.random.fork_rng(devices=[]):
        seed = build_seed(blueprint, channels, topology, inference_only=True).eval()  # eval: a batch norm takes 1 row
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            seed(torch.zeros(1, *feature_shape))
    return count_params(seed), int(counter.get_total_flops())


@functools.cache
def gate_flops(topology: Topology, feature_shape: tuple[int, ...]) -> int:
    """Forward FLOPs per row of the GATE blend's gate (a small MLP on the pooled features)."""
    with torch.device("meta"):
        gate = GatedBlend(_channels(topology, feature_shape), topology)
    x = torch.zeros(1, *feature_shape, device="meta")
    return _counting(gate, lambda: gate(x))


def _channels(topology: Topology, feature_shape: tuple[int, ...]) -> int:
    return feature_shape[topology.channel_dim]


def slot_seed_flops(slot: SeedSlot, feature_shape: tuple[int, ...], *, training: bool = False) -> int:
    """Forward FLOPs per row of the seed in `slot` and its gate, 0 when no seed runs there. In training, a
    TRAINING seed's straight-through output calls no gate."""
    if not slot.is_active or slot.blueprint is None:
        return 0
    total = seed_flops(slot.blueprint, slot.topology, feature_shape)
    if slot.gate is not None and not (training and slot.stage is Stage.TRAINING):
        total += gate_flops(slot.topology, feature_shape)
    return total


@dataclass
class FlopTally:
    """One episode's FLOPs, accumulated epoch by epoch from the rows really processed."""

    train: int = 0
    """Host and seed training (forward + backward), seeds included."""
    train_seeds: int = 0
    """The seeds' part of `train`."""
    validation: int = 0
    """The model as it is (the `main` configuration) on the validation split."""
    counterfactual: int = 0
    """The extra configurations of the fused counterfactual validation (seeds switched off)."""

    def as_info(self) -> dict[str, int]:
        return {
            "flops/train": self.train,
            "flops/train_seeds": self.train_seeds,
            "flops/validation": self.validation,
            "flops/counterfactual": self.counterfactual,
        }


class FlopCounter:
    """Counts a MorphogeneticModel's epochs, given its host preset and each slot's feature shape."""

    def __init__(self, preset: str, slot_shapes: dict[str, tuple[int, ...]]) -> None:
        self.host = host_flops(preset)
        self.slot_shapes = slot_shapes

    def train_epoch(self, slots: list[SeedSlot], rows: int) -> tuple[int, int]:
        """(total, seeds' part) of one training pass over `rows` rows with the seeds as they are now."""
        seeds = 0
        for s in slots:
            forward = slot_seed_flops(s, self.slot_shapes[s.slot_id], training=True)
            trained = any(p.requires_grad for p in s.seed_parameters())
            seeds += forward * (TRAIN_FACTOR if trained else 1)
        return rows * (TRAIN_FACTOR * self.host.forward + seeds), rows * seeds

    def validation(self, slots: list[SeedSlot], alphas: torch.Tensor, rows: int) -> tuple[int, int]:
        """(main configuration, extra counterfactual configurations) of one fused pass (model.fused_forward) over
        `rows` rows: the features before the first active slot whose alpha differs between configurations, and
        that slot's seed, are computed once; everything after it once per configuration."""
        by_id = {s.slot_id: s for s in slots}
        forward = {s.slot_id: slot_seed_flops(s, self.slot_shapes[s.slot_id]) for s in slots}
        main = self.host.forward + sum(forward.values())
        k = alphas.shape[0]
        differs = (alphas != alphas[:1]).any(dim=0).tolist()
        column = {s.slot_id: i for i, s in enumerate(slots)}
        order = [s for s in self.host.order if s in by_id]
        first = next((s for s in order if by_id[s].is_active and differs[column[s]]), None)
        if first is None or k == 1:
            return rows * main, 0
        after = order[order.index(first) :]
        suffix = self.host.forward - self.host.before_slot[first] + sum(forward[s] for s in after[1:])
        return rows * main, rows * (k - 1) * suffix
