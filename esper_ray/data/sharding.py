"""Exact data shards and epoch batching (fixes seed doc 000).

Shard k of n holds samples k, k+n, k+2n, ...: disjoint, and together exactly the training set. An epoch
visits every sample of the shard once; the last short batch is kept, never dropped, and the counts an epoch
reports are the batches and samples it really delivered.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def shard_indices(num_samples: int, shard: int, num_shards: int) -> torch.Tensor:
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard={shard}: must be in [0, num_shards={num_shards})")
    if num_shards > num_samples:
        raise ValueError(f"num_shards={num_shards} exceeds the {num_samples} training samples; every shard needs data")
    return torch.arange(shard, num_samples, num_shards)


class DeviceShard:
    """One env's training shard, resident on its device, served as shuffled batches."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> None:
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"shard needs matching, non-empty inputs and labels, got {len(x)} and {len(y)}")
        self.x = x.to(device)
        self.y = y.to(device)
        self.device = device

    def __len__(self) -> int:
        return len(self.y)

    def num_batches(self, batch_size: int) -> int:
        return -(-len(self) // batch_size)

    def epoch(
        self, generator: torch.Generator, prepare: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole shard in a random order drawn from `generator`, prepared as model input in one pass:
        batch i of the epoch is rows [i * batch, (i + 1) * batch)."""
        order = torch.randperm(len(self), generator=generator, device=self.device)
        return prepare(self.x[order]), self.y[order]
