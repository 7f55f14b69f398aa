"""A user's own parts: a 3-block MLP and a task on numpy arrays, registered on import (grow_mlp.py names this module
in `plugins`, so every process of the run, Ray's workers included, imports it)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import esper_ray
from esper_ray import SlotSpec

FEATURES, CLASSES = 20, 5


def load_spirals(context: object) -> dict:
    """Five noisy interleaved spiral arms in 20 dimensions (2 informative, 18 noise), as numpy arrays. Alone, in 25
    epochs, the host reaches about 0.49 at width 4 and 0.88 at width 8 (plain SGD, no seeds): width 4 leaves room."""
    rng = np.random.default_rng(0)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(CLASSES, size=n)
        t = rng.uniform(0.5, 3.0, size=n)
        angle = t * 1.5 + y * 2 * np.pi / CLASSES
        x = np.zeros((n, FEATURES), dtype=np.float32)
        x[:, 0], x[:, 1] = t * np.cos(angle), t * np.sin(angle)
        x += 0.1 * rng.normal(size=x.shape)
        return x, y

    return {"train": sample(2000), "validation": sample(500), "test": sample(500)}


class MyMLP(esper_ray.HostModule):
    """in -> 3 x (Linear, ReLU) of `width` units -> head. Slot b{i} sees block i's output: a seed planted there adds
    a residual module on those features."""

    def __init__(self, in_features: int = FEATURES, width: int = 4, num_classes: int = CLASSES) -> None:
        super().__init__()
        self.config = {"in_features": in_features, "width": width, "num_classes": num_classes}
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(3)])
        self.head = nn.Linear(width, num_classes)

    def slots(self) -> list[SlotSpec]:
        return [SlotSpec(f"b{i}", (self.config["width"],), "vector") for i in range(3)]

    def describe(self) -> dict:
        return dict(self.config)  # MyMLP(**this) builds the same network: load_grown rebuilds it so

    def example_input(self) -> torch.Tensor:
        return torch.zeros(1, self.config["in_features"])

    def forward(self, x, at_slot=None, hooked=None):
        h = torch.relu(self.stem(x))
        for i, block in enumerate(self.blocks):
            h = block(h)
            if at_slot is not None:
                h = at_slot(f"b{i}", h)
        return self.head(h)


esper_ray.register_task("spirals", load_spirals, hosts=["my-mlp"], batch_size=128, host_lr=0.05)
esper_ray.register_host("my-mlp", MyMLP, width=4)  # a starved host that seeds can rescue
