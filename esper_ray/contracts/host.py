"""Host network shape (DOMAIN.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from esper_ray.contracts.fields import check_int


class Topology(str, Enum):
    """The kind of host: which blueprints fit its slots, and the shape of the features a slot sees."""

    CNN = "cnn"
    """Images: slot features [B, C, H, W]."""
    TRANSFORMER = "transformer"
    """Token sequences: slot features [B, T, C] (the residual stream)."""
    VECTOR = "vector"
    """Feature vectors (an MLP): slot features [B, C]."""

    @property
    def feature_dims(self) -> int:
        """Dimensions of a slot's features, the batch included."""
        return {Topology.CNN: 4, Topology.TRANSFORMER: 3, Topology.VECTOR: 2}[self]

    @property
    def channel_dim(self) -> int:
        """Where the channels are in a slot's feature shape without the batch: (C, H, W), (T, C) or (C,)."""
        return 0 if self is Topology.CNN else -1


def parse_topology(value: object, where: str) -> Topology:
    """A Topology from itself or its name; ValueError naming `where` and the choices otherwise."""
    try:
        return Topology(value)
    except ValueError:
        raise ValueError(f"{where}: topology={value!r}; choose one of {[t.value for t in Topology]}") from None


@dataclass(frozen=True)
class SlotSpec:
    """One injection point a host declares: where seeds can be planted, and what they see there."""

    id: str
    """The slot's name (CNN and transformer hosts: `r{row}c{col}`; a plug-in host names its own)."""
    shape: tuple[int, ...]
    """The features' shape without the batch: (C, H, W) on a CNN, (T, C) on a transformer, (C,) on a vector host."""
    topology: Topology
    """Which blueprints fit here."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "topology", parse_topology(self.topology, f"slot {self.id!r}"))
        object.__setattr__(self, "shape", tuple(self.shape))
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"slot id {self.id!r}: must be a non-empty string")
        if len(self.shape) != self.topology.feature_dims - 1 or not all(
            isinstance(d, int) and d >= 1 for d in self.shape
        ):
            raise ValueError(
                f"slot {self.id!r}: shape={self.shape}; a {self.topology.value} slot's features are "
                f"{self.topology.feature_dims - 1} positive integers without the batch"
            )

    @property
    def channels(self) -> int:
        return self.shape[self.topology.channel_dim]


@dataclass(frozen=True)
class HostConfig:
    in_channels: int
    """Image channels (1 for digits, 3 for CIFAR-10)."""
    image_size: int
    """Side of the square input image in pixels."""
    num_classes: int = 10
    base_channels: int = 8
    """Channels of block 0; block i has base * 2**i."""
    blocks: int = 3
    kernel_size: int = 3
    """Conv kernel side (1 for the starved `impaired` hosts)."""
    pool_layers: int = 3
    """2x2 max-pool after each of the first `pool_layers` blocks; row-1 slots exist only there."""

    def __post_init__(self) -> None:
        for name in ("in_channels", "image_size", "num_classes", "base_channels", "blocks", "kernel_size"):
            check_int(name, getattr(self, name), 1)
        if not 0 <= self.pool_layers <= self.blocks:
            raise ValueError(f"pool_layers={self.pool_layers!r}: must be in [0, blocks={self.blocks}]")
        if self.image_size < 2**self.pool_layers:
            raise ValueError(
                f"pool_layers={self.pool_layers} halves image_size={self.image_size} below 1 pixel; "
                f"use at most {self.image_size.bit_length() - 1} pooling layers"
            )
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={self.kernel_size}: must be odd so that 'same' padding keeps the shape")

    def channels(self, block: int) -> int:
        return self.base_channels * 2**block

    def spatial(self, block: int, after_pool: bool) -> int:
        """Feature map side after block `block` (before or after its pooling)."""
        pools = min(block, self.pool_layers) + (1 if after_pool and block < self.pool_layers else 0)
        return self.image_size // 2**pools
