"""One host epoch on a shard, and one fused counterfactual validation pass.

Both accumulate on the device and synchronise once, at the end (no `.item()` per batch), asleep (gpu_wait.py). All
counts are what was really processed: samples for the image tasks, tokens for text (seed doc 001: the original
counted sequences or batches). The optimisation step itself, and its CUDA-graph capture, live in train_step.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from esper_ray.data.sharding import DeviceShard
from esper_ray.env.gpu_wait import wait_for_stream
from esper_ray.env.gradient_telemetry import GradientCapture
from esper_ray.env.train_step import Precision, StepGraphs, TrainStep
from esper_ray.morpho.model import MorphogeneticModel


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
    graphs: StepGraphs | None = None,
    on_last_batch: GradientCapture | None = None,
) -> TrainStats:
    """Train host and seeds for one pass over the shard. `prepare` turns raw samples into model input.

    The epoch's order and augmentation are drawn for the whole shard at once (a few large kernels instead of a
    few small ones per batch); then every full batch but the last runs through `graphs` (a captured CUDA
    graph where enabled, eager otherwise) with the CNN host's blocks compiled on CUDA (morpho/fused_block.py), and
    the last batch, full or short, runs unfused with the gradient telemetry hook (a graph of its own where enabled).
    """
    model.train()
    graphs = graphs or StepGraphs(enabled=False)
    acc = graphs.accumulators(shard.device)
    acc.reset()
    step = TrainStep(model, host_optimizer, precision, max_grad_norm, acc)
    x_all, y_all = shard.epoch(generator, prepare)
    samples = y_all.numel()  # predictions: images, or tokens of text sequences
    n_batches = shard.num_batches(batch_size)
    capturable = graphs.usable(step)
    for i in range(n_batches):
        x, y = x_all[i * batch_size : (i + 1) * batch_size], y_all[i * batch_size : (i + 1) * batch_size]
        if i == n_batches - 1 and capturable:
            graphs.run_last(step, x, y, on_last_batch)
        elif i == n_batches - 1:
            step(x, y, on_grads=on_last_batch, fuse=False)
        elif capturable:
            graphs.run(step, x, y)
        else:
            step(x, y)
    wait_for_stream(shard.device)  # asleep, not spinning a core
    loss_value, correct_value = torch.stack([acc.loss_sum, acc.correct.to(acc.loss_sum.dtype)]).tolist()  # the one sync
    return TrainStats(batches=n_batches, samples=samples, loss_sum=loss_value, correct=int(correct_value))


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
    k = alphas.shape[0]  # alphas stay on the CPU: fused_forward reads them to share the configurations' prefix
    correct = torch.zeros(k, device=device, dtype=torch.int64)
    loss_sum = torch.zeros(k, device=device)
    with torch.inference_mode():
        accumulate_fused(
            model, x_val, y_val, alphas, None, correct, loss_sum, chunk=chunk, prepare=prepare, precision=precision
        )
    return read_val_stats(correct, loss_sum, y_val.numel())


def accumulate_fused(
    model: MorphogeneticModel,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    alphas: torch.Tensor,
    differs: list[bool] | None,
    correct: torch.Tensor,
    loss_sum: torch.Tensor,
    *,
    chunk: int,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    precision: Precision,
    capturing: bool = False,
) -> None:
    """Add every configuration's correct predictions and loss over the set, chunk by chunk, to `correct` [K] and
    `loss_sum` [K]: the pass that validate_fused runs eagerly and env/validation_graph.py captures."""
    k = alphas.shape[0]
    for start in range(0, len(y_val), chunk):
        x = prepare(x_val[start : start + chunk])
        y = y_val[start : start + chunk]
        with precision.autocast(x_val.device, capturing):
            logits = model.fused_forward(x, alphas, differs).float()  # [K, B, classes] or [K, B, T, vocab]
        logits = logits.reshape(k, -1, logits.shape[-1])  # [K, predictions, classes]
        targets = y.reshape(-1)
        correct += (logits.argmax(dim=2) == targets).sum(dim=1)
        loss_sum += (
            nn.functional.cross_entropy(logits.flatten(0, 1), targets.repeat(k), reduction="none").view(k, -1).sum(1)
        )


def read_val_stats(correct: torch.Tensor, loss_sum: torch.Tensor, samples: int) -> ValStats:
    k = correct.shape[0]
    wait_for_stream(correct.device)  # asleep, not spinning a core
    values = torch.cat([correct.to(loss_sum.dtype), loss_sum]).tolist()  # the one sync
    return ValStats(samples=samples, correct=tuple(int(v) for v in values[:k]), loss_sum=tuple(values[k:]))
