"""The seeds of N stacked CNN hosts (morpho/stacked.py): per slot and blueprint, one stacked seed module over the rows
of the hosts whose model planted that blueprint there (issue 77, cut 4).

Each row computes what its SeedSlot.forward computes alone (slot.py): the seed reads the host's features detached (a
CNN seed always does), a TRAINING seed's slot outputs the host's features exactly with the seed's gradient passed
straight through, and from BLENDING on the slot blends by the row's own alpha and the group's blend (ADD, MULTIPLY or
GATE with the row's own gate). Rows of hosts without a seed there pass their features through, as a dormant slot does.

A group (`group_key`) holds seeds that compute alike: one slot, blueprint, blend, stage kind (TRAINING or blended),
module structure and seed optimizer settings (seed lr while TRAINING, the blended lr from BLENDING on). Its tensors are
stacked as torch.func.stack_module_state stacks a host's, the seed's under "seed.<name>" then the gate's under
"gate.<name>" (SeedSlot.seed_parameters' order), and it runs as torch.func.vmap over functional_call of the first
seed's module: the built-in seeds are convolutions, linear maps and group norms (statistics per sample), which vmap
batches row by row.

What does not stack (`unstackable`, which keeps the env's epoch out of the stack): a seed whose prune is ramping alpha
down (frozen, it keeps the gradients of its last trained batch, which the env's gradient telemetry reads again), and a
seed module that is not one of the built-in blueprints' or that holds buffers (a plug-in's batch norm, say: running
statistics and whatever else a module does in training mode are not reproduced per row here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from esper_ray.contracts.stages import Stage
from esper_ray.morpho.blend import blend
from esper_ray.morpho.blueprints import AttentionSeed, BottleneckSeed, ConvSeed, DepthwiseSeed, NormSeed
from esper_ray.morpho.host import CNNHost
from esper_ray.morpho.slot import SeedSlot
from esper_ray.morpho.stacked import Rows, StackedCNNHosts

BUILTIN_SEEDS = (NormSeed, AttentionSeed, DepthwiseSeed, BottleneckSeed, ConvSeed)
"""Seed modules whose forward vmap batches exactly (convolutions, linear maps, group norms, no buffers)."""


def unstackable(slot: SeedSlot) -> str | None:
    """Why this slot keeps its env's epoch out of a stack; None where it stacks (a seed that trains, or no seed in the
    forward pass: dormant, germinated, cooling down)."""
    if not slot.is_active:
        return None
    if slot.pruning:
        return f"slot {slot.slot_id}: a prune is ramping its seed down"
    if slot.optimizer is None:
        return f"slot {slot.slot_id}: its seed has no optimizer"
    if type(slot.seed) not in BUILTIN_SEEDS:
        return f"slot {slot.slot_id}: seed module {type(slot.seed).__name__} is not a built-in blueprint's"
    modules = [m for m in (slot.seed, slot.gate) if m is not None]
    if any(True for m in modules for _ in m.buffers()):
        return f"slot {slot.slot_id}: its seed holds buffers"
    return None


def stackable(host: nn.Module, slots: Sequence[SeedSlot]) -> bool:
    """Whether a model (its host and slots) can run in a stack: a CNNHost whose active seeds all stack."""
    return type(host) is CNNHost and all(unstackable(s) is None for s in slots)


def _named(slot: SeedSlot) -> list[tuple[str, nn.Parameter]]:
    """The seed's and gate's parameters in SeedSlot.seed_parameters' order, under stacked names."""
    out = [(f"seed.{n}", p) for n, p in slot.seed.named_parameters()]  # type: ignore[union-attr]
    if slot.gate is not None:
        out += [(f"gate.{n}", p) for n, p in slot.gate.named_parameters()]
    return out


def group_key(slot: SeedSlot) -> tuple[Any, ...]:
    """What the seeds of one stacked group share (the slot is active and stackable)."""
    group = slot.optimizer.param_groups[0]  # type: ignore[union-attr]
    return (
        slot.slot_id,
        slot.blueprint,
        slot.algorithm,
        slot.stage is Stage.TRAINING,
        type(slot.seed),
        tuple((n, tuple(p.shape)) for n, p in _named(slot)),
        tuple(group[k] for k in ("lr", "momentum", "weight_decay", "dampening", "nesterov")),
    )


class StackedSeeds:
    """One group's seeds; row j is the seed of host `hosts[j]` (its index among the stacked hosts), held by `slots[j]`.
    `params` are stacked leaves that take gradients; `alphas` [G] the rows' live alphas."""

    def __init__(self, slots: Sequence[SeedSlot], hosts: Sequence[int]) -> None:
        keys = {group_key(s) for s in slots}
        if len(keys) != 1:
            raise ValueError(f"stacked seeds need one group key, got {len(keys)}: {sorted(map(str, keys))}")
        first = slots[0]
        self.slot_id, self.algorithm = first.slot_id, first.algorithm
        self.training = first.stage is Stage.TRAINING
        self.slots, self.hosts = list(slots), list(hosts)
        self.seed_module, self.gate_module = first.seed, first.gate  # templates for functional_call; not written
        named = [_named(s) for s in slots]
        self.names = [n for n, _ in named[0]]
        self.params: dict[str, torch.Tensor] = {
            name: torch.stack([dict(n)[name].detach() for n in named]).requires_grad_() for name in self.names
        }
        self.alphas = torch.stack([s.alpha_value.detach() for s in slots]).float()

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def load(self) -> None:
        """Copy each row's seed and gate parameters and live alpha into the stack, in place (a held stack's captured
        steps read these tensors), in one call."""
        rows, modules = self._row_tensors()
        with torch.no_grad():
            torch._foreach_copy_(rows, modules)
            self.alphas.copy_(torch.stack([s.alpha_value.detach() for s in self.slots]))

    def write_back(self) -> None:
        """Copy each row's parameters into its slot's seed and gate (in place: its optimizer holds the tensors), in
        one call."""
        rows, modules = self._row_tensors()
        with torch.no_grad():
            torch._foreach_copy_(modules, rows)

    def _row_tensors(self) -> tuple[list[torch.Tensor], list[nn.Parameter]]:
        """Each row's stacked tensors (views) and its slot's seed and gate parameters, in the same order."""
        rows = [self.params[name][j] for j in range(len(self.slots)) for name in self.names]
        return rows, [p for slot in self.slots for _, p in _named(slot)]

    def __call__(self, h: torch.Tensor, local: Rows = None, alphas: torch.Tensor | None = None) -> torch.Tensor:
        """The slot's output for stacked host features h [M, C, B, H, W], row k being the seed of group row local[k]
        (all rows, in order, when local is None; a row may repeat). `alphas` [M]: every row blends at alphas[k]
        whatever its stage, as SeedSlot.forward blends at an `alpha_override` (the validation pass's configurations,
        env/stacked_validation.py); None: each row's live alpha, a TRAINING seed straight-through."""
        params = self.params if local is None else {k: v[local] for k, v in self.params.items()}
        override = alphas is not None
        if alphas is None:
            alphas = self.alphas if local is None else self.alphas[local]
        x = h.transpose(1, 2)  # [M, B, C, H, W]: each row as its seed reads it
        seed_in = x.detach()  # a CNN seed reads detached host features at every stage (SeedSlot.isolated)

        straight_through = self.training and not override

        def finish(
            p: dict[str, torch.Tensor],
            host: torch.Tensor,
            s_in: torch.Tensor,
            alpha: torch.Tensor,
            seed_out: torch.Tensor,
        ) -> torch.Tensor:
            if straight_through:
                return host + (seed_out - seed_out.detach())  # the host's value, the seed's gradient
            gate = None
            if self.gate_module is not None:
                gate_p = {k[5:]: v for k, v in p.items() if k.startswith("gate.")}
                gate = lambda z: torch.func.functional_call(self.gate_module, gate_p, (z,))  # noqa: E731
            return blend(self.algorithm, host, seed_out, s_in, alpha, gate)  # type: ignore[arg-type]

        def one(
            p: dict[str, torch.Tensor], host: torch.Tensor, s_in: torch.Tensor, alpha: torch.Tensor
        ) -> torch.Tensor:
            seed_p = {k[5:]: v for k, v in p.items() if k.startswith("seed.")}
            seed_out = torch.func.functional_call(self.seed_module, seed_p, (s_in,))  # type: ignore[arg-type]
            return finish(p, host, s_in, alpha, seed_out)

        if x.shape[0] == 1:  # one seed: its own module's call, without vmap's per-call cost (2x an env step here)
            return one({k: v[0] for k, v in params.items()}, x[0], seed_in[0], alphas[0]).unsqueeze(0).transpose(1, 2)
        if type(self.seed_module) is ConvSeed:  # by hand: vmap makes its kxk convolutions grouped ones, slow here
            seed_p = {k[5:]: v for k, v in params.items() if k.startswith("seed.")}
            seed_out = conv_seed_rows(self.seed_module, seed_p, seed_in.contiguous())
            if straight_through:
                return (x + (seed_out - seed_out.detach())).transpose(1, 2)
            return torch.func.vmap(finish)(params, x, seed_in, alphas, seed_out).transpose(1, 2)
        return torch.func.vmap(one)(params, x, seed_in, alphas).transpose(1, 2)


# Seeds of at most this many channels convolve as one grouped convolution in channels-last on a CPU in training
# (conv_rows); wider ones, and every seed without autograd or off the CPU, one convolution a row.
GROUPED_MAX_CHANNELS = 4


def conv_rows(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row m's kxk convolution (stride 1, same padding, no bias) of its own batch: h [M, B, C, H, W], weight [M, Cout,
    C, k, k] -> [M, B, Cout, H, W]. A 1x1 is one batched product. A kxk on the CPU: mkldnn's grouped convolution (what
    vmap makes of them) is ~5x slower than one convolution a row at 16 rows of 2-8 channels in its default layout, but
    in channels-last ~2x faster forward and backward at 2-4 channels (8x8 maps, 3-16 rows of a 64-sample batch;
    slower from 8 channels on, and in the validation pass's 359-sample batches without autograd). Unfolding the
    patches into a batched product loses to both (the copy costs more than the convolutions)."""
    m, b, c, side_h, side_w = h.shape
    c_out, k = weight.shape[1], weight.shape[-1]
    if k == 1:
        return torch.matmul(weight.view(m, 1, c_out, c), h.reshape(m, b, c, side_h * side_w)).view(
            m, b, c_out, side_h, side_w
        )
    if h.device.type == "cpu" and torch.is_grad_enabled() and max(c, c_out) <= GROUPED_MAX_CHANNELS:
        rows = h.transpose(0, 1).reshape(b, m * c, side_h, side_w).contiguous(memory_format=torch.channels_last)
        y = F.conv2d(rows, weight.reshape(m * c_out, c, k, k), padding=k // 2, groups=m)
        return y.view(b, m, c_out, side_h, side_w).transpose(0, 1)
    return torch.stack([F.conv2d(h[r], weight[r], padding=k // 2) for r in range(m)])


def conv_seed_rows(module: ConvSeed, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """ConvSeed.forward of each row on its own batch, x [M, B, C, H, W], with `params` stacked under the module's
    names: x + gain * (conv -> GroupNorm -> ReLU)^depth, the group norm's statistics per sample, its affine per row."""
    m, b, c, side_h, side_w = x.shape
    layers = list(module.body)
    h = x
    for i in range(0, len(layers), 3):
        norm = layers[i + 1]
        assert isinstance(layers[i], nn.Conv2d) and isinstance(norm, nn.GroupNorm)
        h = conv_rows(h, params[f"body.{i}.weight"])
        h = F.group_norm(h.reshape(m * b, c, side_h, side_w), norm.num_groups, eps=norm.eps).view(h.shape)
        weight, bias = (params[f"body.{i + 1}.{name}"].view(m, 1, c, 1, 1) for name in ("weight", "bias"))
        h = torch.relu(torch.addcmul(bias, h, weight))
    gain = params.get("gain")
    return x + (h if gain is None else gain.view(m, 1, 1, 1, 1) * h)


class StackedModel:
    """Stacked hosts with their stacked seeds: what N MorphogeneticModels' forward computes, row i being model i's."""

    def __init__(self, hosts: StackedCNNHosts, seeds: Sequence[StackedSeeds] = ()) -> None:
        self.hosts, self.seeds = hosts, list(seeds)
        self.by_slot: dict[str, list[StackedSeeds]] = {}
        for group in self.seeds:
            self.by_slot.setdefault(group.slot_id, []).append(group)
        self.n = hosts.n
        # Each set of running rows' seed plan (_plan), built once: its index tensors are built on the host, which a
        # CUDA-graph capture of the step forbids, and a held stack runs the same rows every batch.
        self._plans: dict[tuple[int, ...] | None, dict[int, tuple[torch.Tensor, Rows]]] = {}

    def train(self, mode: bool = True) -> StackedModel:
        self.hosts.train(mode)
        return self

    def __call__(self, x: torch.Tensor, rows: Rows = None) -> torch.Tensor:
        """Logits [M, B, classes] of images [M, B, C, H, W], row k run by model rows[k] (every model when None)."""
        running = None if rows is None else tuple(rows.tolist())
        plan = self._plans.get(running)
        if plan is None:
            plan = self._plans[running] = self._plan(range(self.n) if running is None else running, x.device)
        groups = {id(group): g for g, group in enumerate(self.seeds)}

        def at_slot(slot: str, h: torch.Tensor) -> torch.Tensor:
            for group in self.by_slot.get(slot, ()):
                g = groups[id(group)]
                if g in plan:
                    at, local = plan[g]
                    out = group(h[at], local)
                    # Under autocast a seed's rows come out in fp32 (its blend or straight-through adds the host's
                    # features to fp32 ones), as a lone slot's do, and the model goes on in fp32 from there as the
                    # lone host does: the other rows are promoted with them (exactly: bf16 and fp16 widen to fp32).
                    wide = torch.promote_types(h.dtype, out.dtype)
                    h = h.to(wide).index_copy(0, at, out.to(wide))
            return h

        return self.hosts(x, at_slot, frozenset(self.by_slot), rows)

    def _plan(self, running: Sequence[int], device: torch.device) -> dict[int, tuple[torch.Tensor, Rows]]:
        """Seed group g -> (its rows among the running rows, its members that run: None for all) for the groups with
        a member running."""
        position = {host: k for k, host in enumerate(running)}
        plan: dict[int, tuple[torch.Tensor, Rows]] = {}
        for g, group in enumerate(self.seeds):
            pairs = [(position[h], j) for j, h in enumerate(group.hosts) if h in position]
            if pairs:
                local = [j for _, j in pairs]
                whole = local == list(range(len(group.hosts)))
                plan[g] = (
                    torch.tensor([k for k, _ in pairs], device=device),
                    None if whole else torch.tensor(local, device=device),
                )
        return plan


def stack_seeds(slots_of: Sequence[Sequence[SeedSlot]]) -> list[StackedSeeds]:
    """The stacked seed groups of N models' slots (`slots_of[i]`: model i's), by group_key, rows in model order. Every
    active seed must stack (unstackable is None): ValueError naming the first that does not."""
    groups: dict[tuple[Any, ...], tuple[list[SeedSlot], list[int]]] = {}
    for i, slots in enumerate(slots_of):
        for slot in slots:
            reason = unstackable(slot)
            if reason is not None:
                raise ValueError(f"stacked seeds: model {i}'s {reason}")
            if slot.is_active:
                members = groups.setdefault(group_key(slot), ([], []))
                members[0].append(slot)
                members[1].append(i)
    return [StackedSeeds(slots, hosts) for slots, hosts in groups.values()]
