"""The training step and epoch of N stacked hosts (morpho/stacked.py): what N envs' TrainSteps compute, in calls that
each carry N hosts' work (issue 77). The host alone: no seed, and no gradient telemetry yet (docs/design.md, "Many
hosts per process").

Per host, as train_step.py's CPU path does for one: the mean cross-entropy of its own batch (the hosts' losses are
summed, so host i's gradient is its own loss's), its gradients clipped to `max_grad_norm` by its own norm, and an SGD
step with momentum and weight decay (StackedSGD). Host i's update is row i of each stacked tensor's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from esper_ray.data.sharding import DeviceShard
from esper_ray.env.epoch import TrainStats
from esper_ray.morpho.stacked import Rows, StackedCNNHosts


class StackedSGD:
    """N hosts' SGD optimizers (one lr, momentum and weight decay, no dampening or Nesterov) over stacked tensors, in
    one fused call. The momentum buffers start at zero, which is where torch's SGD starts: its first step sets the
    buffer to the gradient, and 0 * momentum + gradient is the gradient, exactly."""

    def __init__(self, params: Sequence[torch.Tensor], *, lr: float, momentum: float, weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffers = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, rows: Rows = None) -> None:
        """Step every host, or only `rows` (the others keep their parameters and momentum)."""
        params, grads, buffers = self.params, [p.grad for p in self.params], self.momentum_buffers
        if rows is not None:
            params, grads, buffers = ([t[rows] for t in ts] for ts in (params, grads, buffers))  # type: ignore[index]
        torch._fused_sgd_(
            params,
            grads,
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
            is_first_step=False,
        )
        if rows is not None:
            for stacked, new in zip(self.params + self.momentum_buffers, params + buffers):  # type: ignore[operator]
                stacked.index_copy_(0, rows, new)


def clip_per_host(grads: list[torch.Tensor], max_norm: float) -> None:
    """clip_grad_norm_(host i's gradients, max_norm) for every host i at once: the norm of row i of all the stacked
    gradients, and row i scaled by min(1, max_norm / (norm + 1e-6)), as torch's does."""
    norms = torch.linalg.vector_norm(torch.cat([g.flatten(1) for g in grads], dim=1), dim=1)  # [N]
    factor = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    torch._foreach_mul_(grads, [factor.view(-1, *[1] * (g.dim() - 1)) for g in grads])


class StackedTrainStep:
    """One optimisation step of the stacked hosts, each on its own batch; loss sums and correct counts per host."""

    def __init__(self, hosts: StackedCNNHosts, optimizer: StackedSGD, max_grad_norm: float) -> None:
        self.hosts, self.optimizer, self.max_grad_norm = hosts, optimizer, max_grad_norm
        self.loss_sum = torch.zeros(hosts.n)
        self.correct = torch.zeros(hosts.n, dtype=torch.int64)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, rows: Rows = None) -> torch.Tensor:
        """x [M, B, C, H, W], y [M, B]: row k is host rows[k]'s batch (all hosts when rows is None). Returns the
        hosts' losses [M]."""
        logits = self.hosts(x, rows=rows)  # [M, B, classes]
        m, b = y.shape
        losses = nn.functional.cross_entropy(logits.reshape(m * b, -1), y.reshape(-1), reduction="none").view(m, b)
        losses = losses.mean(dim=1)  # each host's mean over its batch, as prediction_loss
        self.optimizer.zero_grad()
        losses.sum().backward()
        grads = [p.grad for p in self.optimizer.params]
        clip_per_host(grads, self.max_grad_norm)  # type: ignore[arg-type]
        self.optimizer.step(rows)
        correct = (logits.argmax(dim=-1) == y).sum(dim=1)
        if rows is None:
            self.loss_sum += losses.detach() * b
            self.correct += correct
        else:
            self.loss_sum.index_add_(0, rows, losses.detach() * b)
            self.correct.index_add_(0, rows, correct)
        return losses.detach()


def train_stacked_epoch(
    step: StackedTrainStep,
    shards: Sequence[DeviceShard],
    generators: Sequence[torch.Generator],
    prepares: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    *,
    batch_size: int,
) -> list[TrainStats]:
    """One pass of host i over shard i, in the order its own generator draws (DeviceShard.epoch, as train_epoch does),
    batch j of every host in one step. Where the shards' lengths differ, batch j's hosts are stacked by batch size."""
    step.hosts.train()
    step.loss_sum.zero_()
    step.correct.zero_()
    epochs = [shard.epoch(g, prepare) for shard, g, prepare in zip(shards, generators, prepares, strict=True)]
    n_batches = [shard.num_batches(batch_size) for shard in shards]
    for j in range(max(n_batches)):
        start, by_size = j * batch_size, {}
        for i, (_, y_all) in enumerate(epochs):
            size = min(batch_size, len(y_all) - start)
            if size > 0:
                by_size.setdefault(size, []).append(i)
        for size, members in by_size.items():
            x = torch.stack([epochs[i][0][start : start + size] for i in members])
            y = torch.stack([epochs[i][1][start : start + size] for i in members])
            step(x, y, rows=None if len(members) == len(shards) else torch.tensor(members))
    loss_sums, corrects = step.loss_sum.tolist(), step.correct.tolist()
    return [
        TrainStats(batches=n_batches[i], samples=len(epochs[i][1]), loss_sum=loss_sums[i], correct=int(corrects[i]))
        for i in range(len(shards))
    ]
