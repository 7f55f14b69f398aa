"""Captured CUDA graphs kept by key, and the eager warm-up a new key takes before its capture: what the env's train
step (train_step.StepGraphs) and validation pass (validation_graph.ValidationGraphs) share.

Why kept by key rather than one at a time: the model comes back to structures it had. After a prune the host trains
alone again, and every episode starts with the host alone (the env keeps its host's tensors across episodes), so
the graphs of the host alone are replayed again instead of warmed up and captured anew. Each capture with its
warm-up made a step some 40 ms slower (benchmarks/probes/capture_costs.py, H100, 4 envs under MPS). A key holds
every object its graph's kernels read, so an equal key means a graph that computes what an eager run would.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class KeptGraphs:
    """Up to `limit` captured graphs by key, the least recently replayed dropped first; `warmup` eager runs of a new
    key before its capture."""

    def __init__(self, limit: int, warmup: int) -> None:
        self.limit, self.warmup = limit, warmup
        self.kept: dict[Hashable, Any] = {}
        """Captured graphs by key, least recently replayed first."""
        self.captured: Any = None
        """The graph replayed last."""
        self.warming: Hashable | None = None
        self.eager_since_change = 0
        self.captures = 0

    def graph_for(self, key: Hashable, capture: Callable[[], Any]) -> Any:
        """The graph to replay for `key`: the one kept, now the most recently replayed, or one `capture()` records
        now; None while the key is still warming up (each None counts one eager run, which the caller makes)."""
        captured = self.kept.pop(key, None)
        if captured is None:
            if self.warming != key:  # a structure with no graph yet: warm it up from scratch
                self.warming, self.eager_since_change = key, 0
            if self.eager_since_change < self.warmup:
                self.eager_since_change += 1
                return None
            captured = capture()
            self.captures += 1
            self.warming = None
        self.kept[key] = captured  # (re-)inserted last: the most recently replayed
        while len(self.kept) > self.limit:
            del self.kept[next(iter(self.kept))]
        self.captured = captured
        return captured

    def forget(self) -> None:
        """Drop every graph (after a rollback: the optimizer state they read is gone)."""
        self.kept.clear()
        self.captured, self.warming, self.eager_since_change = None, None, 0
