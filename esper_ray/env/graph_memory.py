"""One memory pool and one capture stream for every CUDA graph an env captures, and the capture itself.

Why: an env captures its train step and its validation pass again whenever its model changes: a new episode, a
germination, a stage that changes the step's code, a prune. With a random controller that is about 8 captures an
episode. `torch.cuda.graph` synchronises the device and hands every cached block back to the driver before each
capture, so the eager steps after it allocate from the driver again, and each graph gets a private pool of its own,
which only that hand-back frees. Measured with benchmarks/probes/capture_costs.py (H100, 4 envs under MPS): a step that
captured took 90.7 ms against 50.8 ms for a plain one, and such steps were half of the wall. Leaving out the
hand-back alone is no cure: the pools of dropped graphs then pile up until the card runs out of memory.

So an env's graphs all allocate from one `torch.cuda.MemPool` that lives as long as the env: a new graph reuses the
blocks of the graphs dropped before it, and nothing goes back to the driver. The capture waits for the work queued
on the env's stream instead of synchronising the device.

Sharing a pool is safe here because what a graph reads across replays is allocated outside the captures:
parameters, optimizer state (the eager warm-up creates it), batch-norm statistics, accumulators and static inputs.
What a capture allocates (activations, gradients, clip norms) is written before it is read within each replay. The
one exception, the last batch's gradient telemetry (train_step.CapturedStep), is read right after its replay, before
any other graph runs, and stays referenced, so no other capture is ever given its memory. The env's graphs replay
one at a time, in order, on its one stream, so one graph's temporaries never overwrite what another is reading.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch


class GraphMemory:
    """The pool an env's CUDA graphs allocate from, and the stream they are captured on (the same for all of them,
    as sharing a pool asks)."""

    def __init__(self, device: torch.device) -> None:
        with torch.cuda.device(device):
            self.pool = torch.cuda.MemPool()
            self.stream = torch.cuda.Stream()
            # torch's pinned-host allocator counts the graphs of a pool apart from the MemPool, and refuses a pool
            # whose graphs have all been dropped (torch 2.11: "use_count > 0" in CachingHostAllocator.h), as at an
            # episode's start. A graph of one tiny kernel, kept as long as the pool, holds it.
            self._anchor_tensor = torch.zeros(1, device=device)
            self._anchor = torch.cuda.CUDAGraph()
            with capturing(self._anchor, self):
                self._anchor_tensor.add_(1)

    @contextlib.contextmanager
    def capturing(self, graph: torch.cuda.CUDAGraph) -> Iterator[None]:
        """Record into `graph` what the block launches, ordered after the work queued on the current stream."""
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool.id)
            try:
                yield
            finally:
                graph.capture_end()
        current.wait_stream(self.stream)


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, memory: GraphMemory | None) -> Iterator[None]:
    """Capture into the env's shared memory, or, without one, as torch.cuda.graph does (a private pool per graph),
    with Python's cycle collector held off."""
    with _no_cycle_collection(), memory.capturing(graph) if memory is not None else torch.cuda.graph(graph):
        yield


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Why: a dropped graph that a reference cycle holds is freed when the cycle collector next runs, which may be in
    the middle of a capture (any allocation can trigger it). Freeing a graph calls what a capturing stream forbids, and
    the capture fails ("operation not permitted when stream is capturing (function reset)", then
    cudaErrorStreamCaptureInvalidated; seen on an H200 when an earlier env of the same process was collected).
    torch.cuda.graph no longer runs gc.collect() before a capture, and a full collection each time would cost more
    than the capture, so the collector waits until the capture ends instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
