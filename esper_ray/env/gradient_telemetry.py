"""Seed gradient telemetry for gate G2: captured on the device during the last batch, read once after."""

from __future__ import annotations

import torch

from esper_ray.contracts.stages import Stage
from esper_ray.morpho.model import MorphogeneticModel

# Stages whose gradients the G2 gate reads (BLENDING too, for the observation).
MEASURED_STAGES = frozenset({Stage.TRAINING, Stage.BLENDING})


class GradientCapture:
    def __init__(self, model: MorphogeneticModel) -> None:
        self.model = model
        self.host_norm: torch.Tensor | None = None
        self.seed_norms: dict[str, torch.Tensor] = {}

    def __call__(self) -> None:
        """Record norms of the gradients as they are now (device tensors, no sync)."""
        host_grads = [p.grad for p in self.model.host.parameters() if p.grad is not None]
        self.host_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in host_grads]))
        for s in self.model.seed_slots():
            norms = s.gradient_norms() if s.stage in MEASURED_STAGES else None
            if norms is not None:
                self.seed_norms[s.slot_id] = norms

    def take(self, other: GradientCapture) -> None:
        """Hold the norms `other` holds: a captured last step's telemetry, whose tensors its replay just wrote."""
        self.host_norm, self.seed_norms = other.host_norm, dict(other.seed_norms)

    def publish(self) -> None:
        """Copy the captured norms to the host in one transfer and hand them to their slots."""
        if self.host_norm is None or not self.seed_norms:
            return
        names = list(self.seed_norms)
        flat = torch.cat([self.host_norm.float().reshape(1)] + [self.seed_norms[k].float() for k in names]).tolist()
        host_norm, offset = flat[0], 1
        for name in names:
            n = self.seed_norms[name].numel()
            self.model.slot(name).record_gradient_norms(flat[offset : offset + n], host_norm, self.model.host_params)
            offset += n
