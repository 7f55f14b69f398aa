"""A user's own parts, outside esper_ray (tests/test_plugins.py): a numpy task, a 3-block MLP host and a blueprint
for vector hosts, registered on import, as a run's `plugins: [tests.plugin_parts]` imports them in every process."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import esper_ray
from esper_ray import SlotSpec


def blob_splits(seed: int = 5, features: int = 16, classes: int = 4) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Gaussian clusters, one per class, in float64 (the loader's arrays are taken as they come)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, features))

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(classes, size=n)
        return centres[y] + 1.5 * rng.normal(size=(n, features)), y

    return {"train": sample(256), "validation": sample(64), "test": sample(64)}


def load_blobs(context: object) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return blob_splits()


class ToyMLP(esper_ray.HostModule):
    """in -> `blocks` x (Linear, ReLU) -> head; slot h{i} sees block i's output."""

    def __init__(self, in_features: int = 16, width: int = 16, blocks: int = 3, num_classes: int = 4) -> None:
        super().__init__()
        self.description = {"in_features": in_features, "width": width, "blocks": blocks, "num_classes": num_classes}
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)])
        self.head = nn.Linear(width, num_classes)

    def slots(self) -> list[SlotSpec]:
        return [SlotSpec(f"h{i}", (self.description["width"],), "vector") for i in range(len(self.blocks))]

    def describe(self) -> dict:
        return dict(self.description)

    def example_input(self) -> torch.Tensor:
        return torch.zeros(1, self.description["in_features"])

    def forward(self, x, at_slot=None, hooked=None):
        h = torch.relu(self.stem(x))
        for i, block in enumerate(self.blocks):
            h = block(h)
            if at_slot is not None and (hooked is None or f"h{i}" in hooked):
                h = at_slot(f"h{i}", h)
        return self.head(h)


class BottleneckMLPSeed(nn.Module):
    """x + up(relu(down(x))), up zero at birth."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.down = nn.Linear(channels, max(2, channels // 4))
        self.up = nn.Linear(max(2, channels // 4), channels)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(torch.relu(self.down(x)))


def build_bottleneck(channels: int, multiply: bool) -> nn.Module:
    """The blueprint builder: already the identity at birth, so a MULTIPLY blend needs nothing more."""
    return BottleneckMLPSeed(channels)


esper_ray.register_task("toy-blobs", load_blobs, hosts=["toy-mlp"], batch_size=64, host_lr=0.05)
esper_ray.register_host("toy-mlp", ToyMLP, width=16)
esper_ray.register_blueprint("bottleneck", "vector", "tests.plugin_parts:build_bottleneck")  # resolved on first use
