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


class MorphogeneticModel(nn.Module):
    """`host`: a CNNHost or a TransformerHost (anything with `topology`, `slot_ids`, `slot_channels` and
    `forward(x, at_slot)`)."""

    def __init__(self, host: CNNHost | TransformerHost, slots: Sequence[str],
                 lifecycle: LifecycleConfig | None = None) -> None:
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
        return count_params(self.host)

    @property
    def seed_params(self) -> int:
        return sum(s.seed_params for s in self.seed_slots())

    def forward(self, x: torch.Tensor, alpha_overrides: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        def at_slot(slot_id: str, h: torch.Tensor) -> torch.Tensor:
            if slot_id not in self.slots:
                return h
            override = None if alpha_overrides is None else alpha_overrides.get(slot_id)
            return self.slots[slot_id](h, override)

        return self.host(x, at_slot)

    def fused_forward(self, x: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
        """Evaluate K alpha configurations in one pass.

        Args:
            x: inputs [B, C, H, W] (images) or [B, T] (token ids).
            alphas: [K, S] alpha per configuration and enabled slot (in `slot_ids` order); slots without an
                active seed ignore their column.
        Returns:
            logits [K, B, classes] or [K, B, T, vocab]. Use in eval mode: BatchNorm in train mode would mix the
            K copies.
        """
        k, b = alphas.shape[0], x.shape[0]
        if alphas.shape[1] != len(self.slot_ids):
            raise ValueError(f"alphas has {alphas.shape[1]} columns; this model has {len(self.slot_ids)} slots")
        repeated = x.repeat(k, *([1] * (x.dim() - 1)))  # [K*B, ...], config-major
        feature_ones = [1] * (self.topology.feature_dims - 1)  # alpha per sample, broadcast over the slot's features
        per_sample = alphas.to(torch.float32).repeat_interleave(b, dim=0).view(k * b, -1, *feature_ones)  # [K*B, S, 1, ...]
        overrides = {s: per_sample[:, i] for i, s in enumerate(self.slot_ids)}
        logits = self(repeated, overrides)
        return logits.view(k, b, *logits.shape[1:])

    def current_alphas(self) -> torch.Tensor:
        """[S] the live alpha of each slot; a TRAINING seed counts as 0 (its output equals the host's)."""
        return torch.tensor(
            [s.alpha.alpha if s.is_active and s.stage is not Stage.TRAINING else 0.0 for s in self.seed_slots()]
        )

    def step_epoch(self) -> None:
        for s in self.seed_slots():
            s.step_epoch()

    def observe_accuracy(self, accuracy: float) -> None:
        for s in self.seed_slots():
            s.observe_accuracy(accuracy)
