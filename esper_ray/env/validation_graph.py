"""The fused validation pass, replayed from a captured CUDA graph (`graph_validation`, on by default;
benchmarks/gpu_check.sh runs its CUDA test).

Why: a step validates the same device-resident set every epoch, each chunk a few dozen kernels of microseconds:
launch-bound. Eagerly, one lone env's pass took 24 ms of wall a step for 5 ms of kernels; replayed, 11 ms
(H100, issue 22, docs/performance.md). Captured once, the pass is one launch.

What a graph depends on (`validation_key`): the model's host (whose tensors the env keeps across episodes), each
slot's seed modules, blend and gate while it runs (the forward reads them; a dormant slot reads nothing), K and the
slots where the configurations part (`differs`: it decides where fused_forward repeats the batch), the precision and
the chunk. Alpha values are not in the key: the graph reads them from a static device tensor, refilled before each
replay, so a seed's blend ramp keeps its graph. Parameters and batch-norm statistics are read in place, as the
captured train step updates them. The validation set is prepared once, outside the graph (`TaskData.prepare`
copies its constants from the CPU, which a capture must not do), and kept on the device beside the graph.

A key is captured after `WARMUP_PASSES` eager passes (cuDNN chooses its algorithms on them); the eager pass
stays while a seed runs that cannot be captured (`runs_in_cuda_graphs`: flex_attention's eager path) and wherever
graphs are off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from esper_ray.env.epoch import ValStats, accumulate_fused, read_val_stats, validate_fused
from esper_ray.env.graph_memory import GraphMemory, capturing
from esper_ray.env.kept_graphs import KeptGraphs
from esper_ray.env.train_step import Precision
from esper_ray.morpho.model import MorphogeneticModel, configurations_differ
from esper_ray.morpho.transformer_blueprints import runs_in_cuda_graphs

WARMUP_PASSES = 1
# Captured passes an env keeps: the host alone, a seed in TRAINING, then blended (ValidationGraphs).
KEPT_PASSES = 3


class ValidationKey(NamedTuple):
    """Everything a captured validation pass depends on besides tensor values (objects compare by identity)."""

    host: torch.nn.Module
    slots: tuple[tuple[Any, ...], ...]
    configurations: int
    differs: tuple[bool, ...]
    dtype: torch.dtype | None
    chunk: int


def validation_key(model: MorphogeneticModel, alphas: torch.Tensor, precision: Precision, chunk: int) -> ValidationKey:
    per_slot = tuple(
        (s.slot_id, s.algorithm, s.seed, s.gate) if s.is_active else (s.slot_id,) for s in model.seed_slots()
    )
    return ValidationKey(
        model.host, per_slot, alphas.shape[0], tuple(configurations_differ(alphas)), precision.dtype, chunk
    )


def capturable(model: MorphogeneticModel) -> bool:
    return all(runs_in_cuda_graphs(s.seed) for s in model.seed_slots() if s.is_active)


class CapturedValidation:
    """The pass captured as a CUDA graph over the prepared set, a static alpha tensor and static accumulators."""

    def __init__(
        self,
        key: ValidationKey,
        model: MorphogeneticModel,
        x_val: torch.Tensor,
        y_val: torch.Tensor,
        alphas: torch.Tensor,
        *,
        chunk: int,
        prepare: Callable[[torch.Tensor], torch.Tensor],
        precision: Precision,
        memory: GraphMemory | None = None,
    ) -> None:
        self.key, self.model, self.y, self.chunk, self.precision = key, model, y_val, chunk, precision
        self.memory = memory
        self.differs = list(key.differs)
        device = x_val.device
        with torch.inference_mode():
            self.x = prepare(x_val)  # once, outside the graph
        self.alphas = alphas.to(device, torch.float32)
        self.correct = torch.zeros(alphas.shape[0], device=device, dtype=torch.int64)
        self.loss_sum = torch.zeros(alphas.shape[0], device=device)
        self._capture()

    def _pass(self, capturing: bool = False) -> None:
        self.correct.zero_()
        self.loss_sum.zero_()
        accumulate_fused(
            self.model,
            self.x,
            self.y,
            self.alphas,
            self.differs,
            self.correct,
            self.loss_sum,
            chunk=self.chunk,
            prepare=lambda x: x,
            precision=self.precision,
            capturing=capturing,
        )

    def _capture(self) -> None:
        """Record the pass (it runs nothing: the eager passes before it warmed cuDNN up)."""
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), capturing(self.graph, self.memory):
            self._pass(capturing=True)

    def _launch(self) -> None:
        self.graph.replay()

    def replay(self, alphas: torch.Tensor) -> ValStats:
        self.alphas.copy_(alphas)
        self._launch()
        return read_val_stats(self.correct, self.loss_sum, self.y.numel())


class ValidationGraphs(KeptGraphs):
    """The env's captured validation passes, kept by key (kept_graphs.py), and the eager passes it takes to get one.

    `capture` builds the captured pass; tests pass a CPU stand-in to check the bookkeeping without a GPU.
    """

    def __init__(self, enabled: bool, capture: Callable[..., Any] = CapturedValidation) -> None:
        super().__init__(limit=KEPT_PASSES, warmup=WARMUP_PASSES)
        self.enabled = enabled
        self.capture = capture

    def validate(
        self,
        model: MorphogeneticModel,
        x_val: torch.Tensor,
        y_val: torch.Tensor,
        alphas: torch.Tensor,
        *,
        chunk: int,
        prepare: Callable[[torch.Tensor], torch.Tensor],
        precision: Precision,
    ) -> ValStats:
        """What validate_fused returns: from the captured pass when there is one for this key, else eagerly."""
        if not self.enabled or not capturable(model):
            return validate_fused(model, x_val, y_val, alphas, chunk=chunk, prepare=prepare, precision=precision)
        model.eval()
        key = validation_key(model, alphas, precision, chunk)
        captured = self.graph_for(
            key,
            lambda: self.capture(key, model, x_val, y_val, alphas, chunk=chunk, prepare=prepare, precision=precision),
        )
        if captured is None:
            return validate_fused(model, x_val, y_val, alphas, chunk=chunk, prepare=prepare, precision=precision)
        return captured.replay(alphas)
