"""Seed blueprints for vector hosts (MLPs): every seed maps [B, C] to the same shape, residual and the identity at
birth (or, for `attention`, x * sigmoid(3) ~ 0.95 like the CNN's), registered for topology vector
(contracts/registry.py). The norm, LoRA and MLP seeds are the transformer's (they act on the last dimension)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from esper_ray.morpho.blueprints import zeroed
from esper_ray.morpho.transformer_blueprints import LORA_RANK, LoRASeed, MLPSeed, NormSeed


class FeatureGateSeed(nn.Module):
    """x * sigmoid(W2 relu(W1 x) + b2): a squeeze-excite gate on the features; W2 = 0 and b2 = 3 at birth."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = max(1, channels // 4)
        self.squeeze = nn.Linear(channels, hidden, bias=False)
        self.excite = nn.Linear(hidden, channels)
        nn.init.zeros_(self.excite.weight)
        nn.init.constant_(self.excite.bias, 3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.excite(torch.relu(self.squeeze(x))))  # [B, C]

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.excite.weight


BUILDERS: dict[str, Callable[[int, bool], nn.Module]] = {
    "norm": lambda c, z: zeroed(NormSeed(c), z),
    "attention": lambda c, z: zeroed(FeatureGateSeed(c), z),
    "lora": lambda c, z: zeroed(LoRASeed(c, min(LORA_RANK, c)), z),
    "mlp_small": lambda c, z: zeroed(MLPSeed(c, 2 * c), z),
    "mlp": lambda c, z: zeroed(MLPSeed(c, 4 * c), z),
}
