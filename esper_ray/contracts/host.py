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

    @property
    def feature_dims(self) -> int:
        return 4 if self is Topology.CNN else 3


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
