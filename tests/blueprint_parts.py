"""A user's own CNN blueprint under a name of its own (tests/test_plugin_blueprints.py): `dilated`, registered by
`register()` (the plug-in `tests.blueprint_parts:register`), so a test can put the registry back as it was after."""

from __future__ import annotations

import torch
from torch import nn

import esper_ray

PLUGIN = "tests.blueprint_parts:register"


class DilatedSeed(nn.Module):
    """x + gain * relu(GN(dilated 3x3 conv(x))), gain 0 at birth: the identity, with a gradient on the gain."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=2, dilation=2, bias=False)
        self.norm = nn.GroupNorm(1, channels)
        self.gain = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gain * torch.relu(self.norm(self.conv(x)))


def build_dilated(channels: int, multiply: bool) -> nn.Module:
    return DilatedSeed(channels)


def register() -> None:
    esper_ray.register_blueprint("dilated", "cnn", build_dilated)
