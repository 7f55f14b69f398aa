"""A host with seed slots in some of its injection points, and the fused counterfactual forward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from esper_ray.contracts.host import Topology
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.slots import check_slots
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.blueprints import count_params
from esper_ray.morpho.host import CNNHost
from esper_ray.morpho.slot import SeedSlot
from esper_ray.morpho.transformer import TransformerHost


def configurations_differ(alphas: torch.Tensor) -> list[bool]:
    """Per slot (column of alphas [K, S]): do the K configurations disagree? Read on the CPU."""
    alphas_cpu = alphas.detach().cpu()
    return (alphas_cpu != alphas_cpu[:1]).any(dim=0).tolist()


class MorphogeneticModel(nn.Module):
    """`host`: a CNNHost or a TransformerHost (anything with `topology`, `slot_ids`, `slot_channels` and
    `forward(x, at_slot)`)."""

    def __init__(
        self, host: CNNHost | TransformerHost, slots: Sequence[str], lifecycle: LifecycleConfig | None = None
    ) -> None:
        super().__init__()
        self.host = host
        self.topology: Topology = host.topology
        self.slot_ids: list[str] = check_slots(list(slots), host.slot_ids)
        cfg = lifecycle or LifecycleConfig()
        self.slots = nn.ModuleDict({s: SeedSlot(s, host.slot_channels(s), cfg, host.topology) for s in self.slot_ids})

    def slot(self, slot_id: str) -> SeedSlot:
        if slot_id not in self.slots:
            raise ValueError(f"slot {slot_id!r} is not enabled; enabled slots: {self.slot_ids}")
        return self.slots[slot_id]  # type: ignore[return-value]

    def seed_slots(self) -> list[SeedSlot]:
        return [self.slots[s] for s in self.slot_ids]  # type: ignore[misc]

    @property
    def host_params(self) -> int:
        """The host's parameter count, counted once per host module (its structure never changes; every step's
        reward and info read it, and counting walks the module: 0.45 ms an env step on a CPU)."""
        counted = self.host.__dict__.get("_param_count")
        if counted is None:
            counted = self.host.__dict__["_param_count"] = count_params(self.host)
        return counted

    @property
    def seed_params(self) -> int:
        return sum(s.seed_params for s in self.seed_slots())

    def forward(self, x: torch.Tensor, alpha_overrides: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        def at_slot(slot_id: str, h: torch.Tensor) -> torch.Tensor:
            if slot_id not in self.slots:
                return h
            override = None if alpha_overrides is None else alpha_overrides.get(slot_id)
            return self.slots[slot_id](h, override)

        return self.host(x, at_slot, self.active_slot_ids())

    def fused_forward(
        self, x: torch.Tensor, alphas: torch.Tensor, differs: Sequence[bool] | None = None
    ) -> torch.Tensor:
        """Evaluate K alpha configurations in one pass.

        Args:
            x: inputs [B, C, H, W] (images) or [B, T] (token ids).
            alphas: [K, S] alpha per configuration and enabled slot (in `slot_ids` order); slots without an
                active seed ignore their column. Best on the CPU (it is read to find where the configurations
                part; a device tensor costs a sync).
            differs: per slot, whether the configurations' alphas disagree (`configurations_differ`); when given,
                `alphas` is not read on the CPU, so it may live on the device: a captured CUDA graph reads it there,
                refilled before each replay (env/validation_graph.py).
        Returns:
            logits [K, B, classes] or [K, B, T, vocab]. Use in eval mode: BatchNorm in train mode would mix the
            K copies.

        The configurations compute the same features up to the first active slot whose alpha differs between
        them, so that prefix, and that slot's seed, run once on B samples; the slot blends the seed's output K
        ways and everything after it runs on K*B (for the usual plan, `main` and `off:r0c1`, the host's first
        blocks and the seed run once instead of twice).
        """
        k, b = alphas.shape[0], x.shape[0]
        if alphas.shape[1] != len(self.slot_ids):
            raise ValueError(f"alphas has {alphas.shape[1]} columns; this model has {len(self.slot_ids)} slots")
        if differs is None:
            differs = configurations_differ(alphas)
        alphas = alphas.to(x.device, torch.float32)
        feature_ones = [1] * (self.topology.feature_dims - 1)  # alpha per sample, broadcast over the slot's features
        repeated = False

        def at_slot(slot_id: str, h: torch.Tensor) -> torch.Tensor:
            nonlocal repeated
            if slot_id not in self.slots:
                return h
            i = self.slot_ids.index(slot_id)
            slot: SeedSlot = self.slots[slot_id]  # type: ignore[assignment]
            if not repeated and slot.is_active and differs[i]:
                repeated = True  # from here on [K*B, ...], config-major; this slot's seed still sees B samples
                return slot.forward_configurations(h, alphas[:, i])
            rows = alphas[:, i].repeat_interleave(b) if repeated else alphas[0, i].expand(b)
            return slot(h, rows.view(-1, *feature_ones))

        logits = self.host(x, at_slot, self.active_slot_ids())
        if repeated:
            return logits.view(k, b, *logits.shape[1:])
        return logits.expand(k, *logits.shape)  # no active slot tells the configurations apart: all K are this one

    def active_slot_ids(self) -> frozenset[str]:
        """The slots whose seed runs in the forward pass (every other slot passes its features through)."""
        return frozenset(s.slot_id for s in self.seed_slots() if s.is_active)

    def current_alphas(self) -> torch.Tensor:
        """[S] the live alpha of each slot; a TRAINING seed counts as 0 (its output equals the host's)."""
        return torch.tensor(
            [s.alpha.alpha if s.is_active and s.stage is not Stage.TRAINING else 0.0 for s in self.seed_slots()]
        )

    def committed_alphas(self) -> torch.Tensor:
        """[S] the alphas of the committed model: fossilized seeds at their alpha, every other slot 0. What a host
        run keeps when it ends (docs/design.md, "The end of a host run")."""
        return torch.tensor([s.alpha.alpha if s.stage is Stage.FOSSILIZED else 0.0 for s in self.seed_slots()])

    @property
    def committed_seed_params(self) -> int:
        """Parameters of the fossilized seeds: what the committed model adds to the host."""
        return sum(s.seed_params for s in self.seed_slots() if s.stage is Stage.FOSSILIZED)

    def step_epoch(self) -> None:
        for s in self.seed_slots():
            s.step_epoch()

    def observe_accuracy(self, accuracy: float) -> None:
        for s in self.seed_slots():
            s.observe_accuracy(accuracy)
