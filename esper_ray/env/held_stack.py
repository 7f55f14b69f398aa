"""A stacked group's hosts, seeds, optimizers and captured steps, held from one epoch to the next while the group's
envs and their structure stay (issue 77; docs/design.md, "Many hosts per process").

The envs stay the owners of their state (env/vector_env.py's module doc): each epoch copies their hosts, seeds,
alphas and momentum into the stack and writes them back after. Held, the copies go into the same stacked tensors every
epoch, so a CUDA graph captured over them replays in the next epochs as a lone env's captured steps do
(env/train_step.py): on a GPU a group's batches run as one graph launch each, after one eager step and the capture
of a step the group has not had (its full batch; its last, with the gradient telemetry, in a graph of its own); a
batch of only some hosts (shards of unequal length end apart) and an fp16 group's steps (each env's GradScaler reads
found_inf on the host) run eager.

`held_key` says when a held stack no longer fits its envs: a new host module, optimizer or scaler, a seed planted,
pruned or moved on to another stage kind, a training setting changed. Everything a captured step reads besides tensor
values is in it (objects by identity, kept referenced so that none is reused), as in a lone env's graph keys.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from esper_ray.env.epoch import TrainStats
from esper_ray.env.gradient_telemetry import MEASURED_STAGES, GradientCapture
from esper_ray.env.graph_memory import GraphMemory, capturing
from esper_ray.env.kept_graphs import KeptGraphs
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.env.stacked_step import (
    StackedSGD,
    StackedTelemetry,
    StackedTrainStep,
    load_momentum,
    seed_optimizer,
    store_momentum,
    train_stacked_epoch,
)
from esper_ray.env.train_step import WARMUP_STEPS
from esper_ray.morpho.stacked import StackedCNNHosts
from esper_ray.morpho.stacked_seeds import StackedSeeds, group_key, stack_seeds

# Steps a held stack keeps a graph for: its full batch, and its last with the telemetry (a seed moving on from
# BLENDING to HOLDING makes another).
KEPT_STEPS = 3


def held_key(envs: Sequence[MorphogeneticEnv]) -> tuple[Any, ...]:
    """What a held stack of these envs was built from, besides tensor values: each env's host module, host optimizer
    and GradScaler, and each active seed's slot, module, gate, optimizer and group (morpho/stacked_seeds.group_key)."""
    return tuple(
        (
            env.model.host,  # type: ignore[union-attr]
            env.host_optimizer,
            env.precision.scaler,
            tuple(
                (slot, slot.seed, slot.gate, slot.optimizer, group_key(slot))
                for slot in env.model.seed_slots()  # type: ignore[union-attr]
                if slot.is_active
            ),
        )
        for env in envs
    )


class CapturedStackedStep:
    """A StackedTrainStep of every host captured as one CUDA graph over static input buffers of one batch shape, into
    the vector env's graph memory (graph_memory.py: what it reads across replays, the stack's tensors and
    accumulators, is allocated outside the capture). With `measured` hosts (the epoch's last batch) it records their
    gradient telemetry into a StackedTelemetry of its own, which each replay rewrites and hands over as copies."""

    def __init__(
        self, step: StackedTrainStep, x: torch.Tensor, y: torch.Tensor, memory: GraphMemory, measured: list[int]
    ) -> None:
        self.step, self.static_x, self.static_y = step, torch.empty_like(x), torch.empty_like(y)
        telemetry = self.telemetry = StackedTelemetry(step.hosts.n) if measured else None
        self.on_grads = None  # no reference back to self: a graph in a reference cycle is freed whenever gc runs
        if telemetry is not None:
            self.on_grads = lambda s, running: telemetry(s, running, measured)  # noqa: E731
        self.record(memory)

    def run(self, capturing: bool) -> None:
        self.step(self.static_x, self.static_y, on_grads=self.on_grads, capturing=capturing)

    def record(self, memory: GraphMemory) -> None:
        """Capture the step (which runs nothing)."""
        self.graph = torch.cuda.CUDAGraph()
        with capturing(self.graph, memory):
            self.run(True)

    def play(self) -> None:
        """What the step computes, on the static inputs."""
        self.graph.replay()

    def replay(self, x: torch.Tensor, y: torch.Tensor, telemetry: StackedTelemetry | None) -> None:
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.play()
        if telemetry is not None and self.telemetry is not None:
            telemetry.take(self.telemetry)


class HeldStack:
    """The stacked hosts, seeds and their optimizers of one group of envs (stack_key and held_key fixed), and on a GPU
    their captured steps. `train_epoch` trains one epoch of the envs it was built for."""

    def __init__(self, envs: Sequence[MorphogeneticEnv], memory: GraphMemory | None) -> None:
        first = envs[0]
        group = first.host_optimizer.param_groups[0]
        models = [env.model for env in envs]
        self.hosts = StackedCNNHosts([model.host for model in models])  # type: ignore[union-attr,misc]
        self.sgd = StackedSGD(
            self.hosts.parameters(), lr=group["lr"], momentum=group["momentum"], weight_decay=group["weight_decay"]
        )
        self.seeds = [(g, seed_optimizer(g)) for g in stack_seeds([m.seed_slots() for m in models])]  # type: ignore[union-attr]
        fp16 = first.precision.scaler is not None
        self.step = StackedTrainStep(
            self.hosts,
            self.sgd,
            first.cfg.max_grad_norm,
            self.seeds,
            first.precision,
            [env.precision.scaler for env in envs] if fp16 else None,  # type: ignore[misc]
        )
        self.memory = memory if memory is not None and first.cfg.cuda_graphs and not fp16 else None
        self.graphs = KeptGraphs(limit=KEPT_STEPS, warmup=WARMUP_STEPS)
        self._fresh = True  # built from the envs' tensors as they stand: the first epoch need not copy them in

    def train_epoch(self, envs: Sequence[MorphogeneticEnv]) -> list[TrainStats]:
        """One epoch of each env's host and seeds, stacked: their tensors, alphas and momentum copied in, trained, and
        written back into each env's own modules and optimizers; each env's gradient telemetry handed to its slots
        as its own epoch would (GradientCapture.publish)."""
        models = [env.model for env in envs]
        hosts = [model.host for model in models]  # type: ignore[union-attr]
        host_rows = [(env.host_optimizer, list(host.parameters())) for env, host in zip(envs, hosts, strict=True)]
        if not self._fresh:
            self.hosts.load_from(hosts)  # type: ignore[arg-type]
            for seed_group, _ in self.seeds:
                seed_group.load()
        self._fresh = False
        load_momentum(self.sgd, host_rows)
        for seed_group, seed_sgd in self.seeds:
            load_momentum(seed_sgd, seed_rows(seed_group))
        telemetry = StackedTelemetry(len(envs))
        first = envs[0]
        stats = train_stacked_epoch(
            self.step,
            [env.shard for env in envs],
            [env.data_generator for env in envs],
            [env._prepare_train for env in envs],
            batch_size=first.cfg.effective_batch_size,
            telemetry=telemetry,
            run_whole=functools.partial(self._run_captured, telemetry) if self.memory is not None else None,
        )
        for i, host in enumerate(hosts):
            self.hosts.write_to(i, host)  # type: ignore[arg-type]
        store_momentum(self.sgd, host_rows)
        for seed_group, seed_sgd in self.seeds:
            seed_group.write_back()
            store_momentum(seed_sgd, seed_rows(seed_group))
        for i, env in enumerate(envs):
            capture = GradientCapture(env.model)  # type: ignore[arg-type]
            capture.host_norm, capture.seed_norms = telemetry.host_norms[i], telemetry.seed_norms[i]
            capture.publish()
        return stats

    @property
    def captures(self) -> int:
        """Graphs this stack has captured."""
        return self.graphs.captures

    def _run_captured(self, telemetry: StackedTelemetry, x: torch.Tensor, y: torch.Tensor, measured: list[int]) -> None:
        """A step of every host, with the epoch's `telemetry` of hosts `measured` (their last batch): replayed, captured
        then replayed, or (warming up) eager. Its key: the batch's shape, the hosts measured and the seed rows whose
        telemetry is read (MEASURED_STAGES: a seed that moves on to HOLDING keeps its group, not its telemetry)."""
        memory = self.memory
        assert memory is not None
        seeds_measured = tuple(
            (g, j)
            for g, (group, _) in enumerate(self.seeds)
            for j, host in enumerate(group.hosts)
            if host in measured and group.slots[j].stage in MEASURED_STAGES
        )
        key = (tuple(x.shape), tuple(measured), seeds_measured)
        captured = self.graphs.graph_for(key, lambda: CapturedStackedStep(self.step, x, y, memory, measured))
        if captured is not None:
            captured.replay(x, y, telemetry if measured else None)
        elif measured:
            self.step(x, y, on_grads=lambda s, running: telemetry(s, running, measured))
        else:
            self.step(x, y)


def seed_rows(group: StackedSeeds) -> list[tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]]:
    """Each row's seed optimizer and tensors, in the group's order."""
    return [(slot.optimizer, slot.seed_parameters()) for slot in group.slots]  # type: ignore[misc]
