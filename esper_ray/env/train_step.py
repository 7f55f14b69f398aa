"""One optimisation step of host and seeds on one batch, run eagerly or replayed from a captured CUDA graph.

The tiny hosts are launch-bound: a batch of the cifar10 host is ~100 kernel launches of microseconds each, so
the GPU waits on Python. Captured once as a CUDA graph, the whole step (forward, loss, backward, gradient
clips, host and seed optimizer steps, loss/accuracy accumulation) is one launch.

What may be captured: the steps of an fp32 or bf16 run (fp16's GradScaler reads found_inf on the host), the
epoch's last batch in a graph of its own (its shape, unfused, with the gradient telemetry, whose norms stay device
tensors), and no step in which a seed runs that cannot be captured (`runs_in_cuda_graphs`: a flex_attention seed
on its eager path copies from the CPU as it computes). A graph is tied to the module
structure it was captured with, so it is keyed by everything that changes the step's code path or its
tensors (`slot_key`): the seeds that run, the branch each takes, their blends and optimizers, the host
optimizer, and the precision. A new
key is captured after `WARMUP_STEPS` eager steps; the capture itself runs nothing, so every batch is trained
exactly once, in order, and a graph replay computes what the eager step would (the same kernels on the same data).
One eager step is enough: it creates the optimizers' momentum (the only state a step adds), compiles the host's
blocks on their first call and lets cuDNN choose its algorithms, so the next step, the one recorded, takes the path
every later step takes. A step's graphs are kept by key (StepGraphs), so a structure the model comes back to is
not captured again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.sgd import sgd

from esper_ray.contracts.stages import Stage
from esper_ray.env.gradient_telemetry import MEASURED_STAGES, GradientCapture
from esper_ray.env.graph_memory import GraphMemory, capturing
from esper_ray.env.kept_graphs import KeptGraphs
from esper_ray.morpho import cpu_step, fused_block
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.slot import SeedSlot
from esper_ray.morpho.transformer_blueprints import runs_in_cuda_graphs

# Stages whose seed is trained by its own optimizer (a pruning seed is frozen).
TRAINED_STAGES = frozenset({Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED})
WARMUP_STEPS = 1
# Captured steps an env keeps: for the host alone, a seed in TRAINING, then blended, a full batch's and the last's.
KEPT_STEPS = 6


def prediction_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The training loss: the mean cross-entropy over every prediction, in nats. Images: logits [B, classes], targets
    [B]; text: logits [B, T, vocab], targets [B, T] (every position predicts the next byte)."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass
class Precision:
    """Autocast dtype (None = fp32) and the env's own GradScaler (fp16 only)."""

    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def autocast(self, device: torch.device, capturing: bool = False) -> contextlib.AbstractContextManager[object]:
        if self.dtype is None:
            return contextlib.nullcontext()
        # A graph must not keep autocast's cast cache from capture time (torch's CUDA-graph notes).
        return torch.autocast(device_type=device.type, dtype=self.dtype, cache_enabled=not capturing)


def trained_slots(model: MorphogeneticModel) -> list[SeedSlot]:
    return [s for s in model.seed_slots() if s.stage in TRAINED_STAGES and s.optimizer is not None and not s.pruning]


def slot_key(slot: SeedSlot, trained: bool) -> tuple[Any, ...]:
    """What the step's code reads of a slot. Nothing while no seed runs in the forward pass (dormant, germinated,
    pruned, embargoed, resetting: one and the same step). Else the seed's modules and optimizer, its blend, the
    branch it takes in the forward pass (TRAINING adds only the seed's gradient; later stages blend by the
    slot's alpha tensor, which a replay reads) and whether its optimizer steps. So BLENDING -> HOLDING ->
    FOSSILIZED keep the captured graph, and a prune's ramp-down (no longer trained) gets a new one."""
    if not slot.is_active:
        return (slot.slot_id,)
    return (slot.slot_id, slot.stage is Stage.TRAINING, trained, slot.algorithm, slot.seed, slot.gate, slot.optimizer)


class Accumulators:
    """Loss sum and correct count of an epoch, on the device (read once, at the end)."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device, dtype=torch.int64)

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.correct.zero_()


class TrainStep:
    """The step, eager: what a captured graph replays."""

    def __init__(
        self,
        model: MorphogeneticModel,
        host_optimizer: torch.optim.Optimizer,
        precision: Precision,
        max_grad_norm: float,
        accumulators: Accumulators,
    ) -> None:
        self.model, self.host_optimizer, self.precision = model, host_optimizer, precision
        self.max_grad_norm, self.acc = max_grad_norm, accumulators
        self.slots = trained_slots(model)
        self.host_params = list(model.host.parameters())
        # What each optimizer steps and the step clips: the host's parameters, then each trained seed's.
        self.clipped = [self.host_params] + [s.seed_parameters() for s in self.slots]
        # On the CPU the step clears and clips the gradients itself: zero_grad's and clip_grad_norm_'s kernels without
        # their Python per call (morpho/cpu_step.py).
        self.lean = cpu_step.on(self.host_params[0].device)
        # The model's structure changes only between epochs (lifecycle steps), and a TrainStep lives for one epoch:
        # its key is computed once, not per batch.
        per_slot = tuple(slot_key(s, trained=s in self.slots) for s in model.seed_slots())
        self._key = (per_slot, host_optimizer, precision.dtype, max_grad_norm)
        # False while a seed that cannot run in a CUDA graph runs in the forward pass (a prune's ramp-down included).
        self.capturable = all(runs_in_cuda_graphs(s.seed) for s in model.seed_slots() if s.is_active)
        # Which parameters get gradients is fixed with the structure, so new momentum buffers can only be needed at
        # this step's first call (start_momentum_of_new_grads), never on the hot path after it.
        self.momentum_started = False

    def key(self) -> tuple[Any, ...]:
        """Everything a captured graph depends on besides tensor values (objects compare by identity)."""
        return self._key

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        on_grads: Callable[[], None] | None = None,
        capturing: bool = False,
        fuse: bool = True,
    ) -> None:
        """`fuse`: CNN host blocks may run compiled (fused_block.py); the epoch's last batch says False, so that
        only the env's one full batch shape is ever compiled."""
        scaler = self.precision.scaler
        with self.precision.autocast(x.device, capturing), fused_block.fusing(fuse):
            logits = self.model(x)
        loss = prediction_loss(logits.float(), y)
        optimizers = [self.host_optimizer] + [s.optimizer for s in self.slots]
        if self.lean:
            for params in self.clipped:
                for p in params:
                    p.grad = None  # zero_grad(set_to_none=True) of the optimizers over these parameters
        else:
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            for opt in optimizers:
                scaler.unscale_(opt)  # type: ignore[arg-type]
        if on_grads is not None:
            on_grads()  # gradient telemetry reads the unclipped gradients (as device tensors)
        if self.lean:
            clip_grad_norms(self.clipped, self.max_grad_norm)
        else:
            for params in self.clipped:
                torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if not self.momentum_started:
            for opt in optimizers:
                start_momentum_of_new_grads(opt)  # type: ignore[arg-type]
            self.momentum_started = True
        for opt in optimizers:
            if scaler is not None:
                scaler.step(opt)  # type: ignore[arg-type]
            elif self.lean:
                sgd_step(opt)  # type: ignore[arg-type]
            else:
                opt.step()  # type: ignore[union-attr]
        if scaler is not None:
            scaler.update()
        self.acc.loss_sum += loss.detach() * y.numel()  # summed over predictions: samples, or tokens for text
        self.acc.correct += (logits.argmax(dim=-1) == y).sum()


def clip_grad_norms(groups: list[list[torch.Tensor]], max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_(group, max_norm) of each group, with its kernels (the gradients' 2-norms, the
    norm of those, the factor min(1, max_norm / (norm + 1e-6)), the gradients times it) on one device, the
    per-tensor norms of all groups in one call."""
    grads = [[p.grad for p in group if p.grad is not None] for group in groups]
    norms = torch._foreach_norm([g for group in grads for g in group])
    start = 0
    for group in grads:
        if not group:
            continue
        total = torch.linalg.vector_norm(torch.stack(norms[start : start + len(group)]))
        start += len(group)
        torch._foreach_mul_(group, torch.clamp(max_norm / (total + 1e-6), max=1.0))


@torch.no_grad()
def sgd_step(optimizer: torch.optim.SGD) -> None:
    """optimizer.step(): what SGD.step runs (torch's functional sgd on each group, its momentum kept in the
    optimizer's state) without Optimizer.step's wrapper, whose hooks and checks cost more than the fused kernel
    itself on the CPU."""
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        momentum = [optimizer.state[p].get("momentum_buffer") for p in params] if group["momentum"] else []
        sgd(
            params,
            [p.grad for p in params],
            momentum,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=group["lr"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            maximize=group["maximize"],
            foreach=group["foreach"],
            fused=group["fused"],
        )
        for p, buffer in zip(params, momentum):
            optimizer.state[p]["momentum_buffer"] = buffer


def start_momentum_of_new_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give a zero momentum buffer to each parameter that has a gradient for the first time in a group whose
    other parameters already have one. A seed's gate (GatedBlend) first gets gradients when the seed starts to
    blend, after the seed's own parameters have stepped; the fused SGD kernel (CUDA) takes a group's buffers as
    all new or all there and raised TypeError on the mix, losing the env step. A zero buffer gives what a first
    step gives (buffer = gradient, SGD's dampening being 0), so the foreach path (CPU) computes the same as before.
    TrainStep runs this at its first call, an eager step before its structure is captured, so a captured step
    finds every buffer there."""
    for group in optimizer.param_groups:
        if group.get("momentum", 0) == 0:
            continue
        with_grad = [p for p in group["params"] if p.grad is not None]
        missing = [p for p in with_grad if optimizer.state[p].get("momentum_buffer") is None]
        if missing and len(missing) < len(with_grad):
            for p in missing:
                optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class CapturedStep:
    """A TrainStep captured as a CUDA graph over static input buffers of one batch shape, into the env's graph
    memory when given one (graph_memory.py). An epoch's last batch is captured with its gradient telemetry
    (`on_grads`) and unfused, like its eager step: each replay writes the norms into the tensors of the telemetry it
    was captured with, and hands them to the epoch's own."""

    def __init__(
        self,
        step: TrainStep,
        x: torch.Tensor,
        y: torch.Tensor,
        memory: GraphMemory | None = None,
        on_grads: GradientCapture | None = None,
        fuse: bool = True,
    ) -> None:
        self.key = step.key()
        self.on_grads = on_grads
        self.static_x, self.static_y = torch.empty_like(x), torch.empty_like(y)
        self.graph = torch.cuda.CUDAGraph()
        with capturing(self.graph, memory):
            step(self.static_x, self.static_y, on_grads=on_grads, capturing=True, fuse=fuse)

    def replay(self, x: torch.Tensor, y: torch.Tensor, on_grads: GradientCapture | None = None) -> None:
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.graph.replay()
        if on_grads is not None and self.on_grads is not None:
            on_grads.take(self.on_grads)


class StepGraphs(KeptGraphs):
    """The env's captured steps, kept by key (kept_graphs.py), the eager steps it takes to get one, and the
    accumulators every step of the env writes to (a graph writes to the tensors it was captured with, so they must
    outlive epochs). A step's key holds every object its kernels read: the model's host, the host optimizer and its
    state, each running seed, its optimizer and blend.

    `capture` builds the captured step; tests pass a CPU stand-in to check the bookkeeping without a GPU.
    """

    def __init__(
        self, enabled: bool, capture: Callable[[TrainStep, torch.Tensor, torch.Tensor], Any] = CapturedStep
    ) -> None:
        super().__init__(limit=KEPT_STEPS, warmup=WARMUP_STEPS)
        self.enabled = enabled
        self.capture = capture
        self._accumulators: Accumulators | None = None

    def accumulators(self, device: torch.device) -> Accumulators:
        """The same tensors every epoch (a captured graph adds to the ones it was captured with)."""
        if self._accumulators is None:
            self._accumulators = Accumulators(device)
        return self._accumulators

    def usable(self, step: TrainStep) -> bool:
        return self.enabled and step.precision.scaler is None and step.capturable

    def run(self, step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> None:
        """One full-size batch that is not the epoch's last: replay, capture, or (while warming up) eager."""
        captured = self.graph_for(step.key(), lambda: self.capture(step, x, y))
        if captured is None:
            step(x, y)
        else:
            captured.replay(x, y)

    def run_last(self, step: TrainStep, x: torch.Tensor, y: torch.Tensor, on_grads: GradientCapture | None) -> None:
        """The epoch's last batch (often short) with its gradient telemetry, unfused (only the full batch's shape is
        compiled): replay, capture, or (while warming up) eager. Its key adds the batch's shape and the slots whose
        gradients the telemetry measures (MEASURED_STAGES: a seed that moves on to HOLDING keeps its step, not its
        telemetry)."""
        measured = tuple(s.slot_id for s in step.model.seed_slots() if s.stage in MEASURED_STAGES)
        key = ("last batch", step.key(), tuple(x.shape), on_grads is not None, measured)
        captured = self.graph_for(key, lambda: self.capture(step, x, y, on_grads=on_grads, fuse=False))
        if captured is None:
            step(x, y, on_grads=on_grads, fuse=False)
        else:
            captured.replay(x, y, on_grads)
