"""One host epoch on a shard, and one fused counterfactual validation pass.

Both accumulate on the device and synchronise once, at the end (no `.item()` per batch). All counts are
what was really processed: samples for the classification tasks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from esper_ray.contracts.stages import Stage
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.slot import SeedSlot
from esper_ray.data.sharding import DeviceShard

# Stages whose seed is trained by its own optimizer (a pruning seed is frozen).
TRAINED_STAGES = frozenset({Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})


@dataclass(frozen=True)
class TrainStats:
    batches: int
    samples: int
    loss_sum: float
    correct: int

    @property
    def loss(self) -> float:
        return self.loss_sum / self.samples

    @property
    def accuracy(self) -> float:
        return self.correct / self.samples


@dataclass(frozen=True)
class ValStats:
    samples: int
    correct: tuple[int, ...]
    """Correct predictions per counterfactual configuration."""
    loss_sum: tuple[float, ...]

    def accuracy(self, config: int = 0) -> float:
        return self.correct[config] / self.samples

    def loss(self, config: int = 0) -> float:
        return self.loss_sum[config] / self.samples


@dataclass
class Precision:
    """Autocast dtype (None = fp32) and the env's own GradScaler (fp16 only)."""

    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[object]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)


def trained_slots(model: MorphogeneticModel) -> list[SeedSlot]:
    return [s for s in model.seed_slots() if s.stage in TRAINED_STAGES and s.optimizer is not None and not s.pruning]


def train_epoch(
    model: MorphogeneticModel,
    host_optimizer: torch.optim.Optimizer,
    shard: DeviceShard,
    *,
    batch_size: int,
    generator: torch.Generator,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    precision: Precision,
    max_grad_norm: float,
    on_last_batch: Callable[[], None] | None = None,
) -> TrainStats:
    """Train host and seeds for one pass over the shard. `prepare` turns a raw batch into model input."""
    model.train()
    device = shard.device
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    slots = trained_slots(model)
    host_params = list(model.host.parameters())
    batches = samples = 0
    n_batches = shard.num_batches(batch_size)
    scaler = precision.scaler
    for x_raw, y in shard.batches(batch_size, generator):
        x = prepare(x_raw)
        with precision.autocast(device):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
        host_optimizer.zero_grad(set_to_none=True)
        for s in slots:
            s.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        (scaler.scale(loss) if scaler is not None else loss).backward()
        optimizers = [host_optimizer] + [s.optimizer for s in slots]
        if scaler is not None:
            for opt in optimizers:
                scaler.unscale_(opt)  # type: ignore[arg-type]
        batches += 1
        if batches == n_batches and on_last_batch is not None:
            on_last_batch()  # gradient telemetry reads the last batch's unclipped gradients (as device tensors)
        torch.nn.utils.clip_grad_norm_(host_params, max_grad_norm)
        for s in slots:
            torch.nn.utils.clip_grad_norm_(s.seed_parameters(), max_grad_norm)
        for opt in optimizers:
            if scaler is not None:
                scaler.step(opt)  # type: ignore[arg-type]
            else:
                opt.step()  # type: ignore[union-attr]
        if scaler is not None:
            scaler.update()
        samples += len(y)
        loss_sum += loss.detach() * len(y)
        correct += (logits.argmax(dim=1) == y).sum()
    loss_value, correct_value = torch.stack([loss_sum, correct.to(loss_sum.dtype)]).tolist()  # the one sync
    return TrainStats(batches=batches, samples=samples, loss_sum=loss_value, correct=int(correct_value))


def validate_fused(
    model: MorphogeneticModel,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    alphas: torch.Tensor,
    *,
    chunk: int,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    precision: Precision,
) -> ValStats:
    """Accuracy and loss of every alpha configuration (rows of `alphas` [K, S]) in one pass over the set."""
    model.eval()
    device = x_val.device
    k = alphas.shape[0]
    alphas = alphas.to(device)
    correct = torch.zeros(k, device=device, dtype=torch.int64)
    loss_sum = torch.zeros(k, device=device)
    with torch.inference_mode():
        for start in range(0, len(y_val), chunk):
            x = prepare(x_val[start : start + chunk])
            y = y_val[start : start + chunk]
            with precision.autocast(device):
                logits = model.fused_forward(x, alphas).float()  # [K, B, classes]
            correct += (logits.argmax(dim=2) == y).sum(dim=1)
            loss_sum += nn.functional.cross_entropy(logits.flatten(0, 1), y.repeat(k), reduction="none").view(k, -1).sum(1)
    values = torch.cat([correct.to(loss_sum.dtype), loss_sum]).tolist()  # the one sync
    return ValStats(samples=len(y_val), correct=tuple(int(v) for v in values[:k]), loss_sum=tuple(values[k:]))
