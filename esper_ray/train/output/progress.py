"""Progress inside a training round, which can be minutes of silence (a round of 150-epoch CPU episodes).

Env runners count their env steps into a small named actor (fire-and-forget calls, at most two a second per
runner, and one at the end of each sample, so a finished round is counted whole); while `algo.train()` blocks,
a thread of the command reads the count twice a second and draws a tqdm bar of the round's steps. Where stderr
is not a terminal (log files, CI, benchmarks) there is no bar and no counter. (A call per step held the default
run on 2 CPU cores to 0.55 of its envs' bare speed, against 0.64 without: benchmarks/throughput.py.)
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from types import TracebackType
from typing import Any

import ray
from tqdm import tqdm

PROGRESS_ACTOR_KEY = "progress_actor"
"""learner_config_dict key naming the step counter actor (the one free-form dict every env runner can read)."""
POLL_SECONDS = 0.5
REPORT_SECONDS = 0.5


@ray.remote(num_cpus=0)
class StepCounter:
    def __init__(self) -> None:
        self.steps = 0

    def add(self, steps: int) -> None:
        self.steps += steps

    def read(self) -> int:
        return self.steps


def start_step_counter() -> tuple[str | None, Any]:
    """A fresh named counter for this run, (name, handle); (None, None) where no bar can be drawn."""
    if not sys.stderr.isatty():
        return None, None
    name = f"esper-ray-steps-{uuid.uuid4().hex[:12]}"
    return name, StepCounter.options(name=name).remote()  # type: ignore[attr-defined]


class StepReporter:
    """Env-runner side: counts steps into the run's counter, if the run has one (Tune trials do not), sending
    what has piled up at most every `REPORT_SECONDS` and at the end of each sample."""

    def __init__(self) -> None:
        self.counter: Any = None
        self.looked_up = False
        self.pending = 0
        self.last_sent = 0.0

    def step(self, env_runner: Any) -> None:
        if not self.looked_up:
            self.looked_up = True
            name = env_runner.config.learner_config_dict.get(PROGRESS_ACTOR_KEY)
            try:
                self.counter = ray.get_actor(name) if name else None
            except ValueError:  # the command that drew the bar is gone (the counter dies with it)
                self.counter = None
        if self.counter is not None:
            self.pending += 1
            if time.monotonic() - self.last_sent >= REPORT_SECONDS:
                self.flush()

    def flush(self) -> None:
        if self.counter is not None and self.pending:
            self.counter.add.remote(self.pending)
            self.pending, self.last_sent = 0, time.monotonic()


class RoundBar:
    """Context manager around one round: a bar of its env steps, fed by the counter."""

    def __init__(self, counter: Any, round_: int, rounds: int, steps: int) -> None:
        self.counter, self.steps = counter, steps
        self.bar = tqdm(
            total=steps,
            desc=f"round {round_}/{rounds}",
            unit="step",
            leave=False,
            disable=True if counter is None else None,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            done = min(ray.get(self.counter.read.remote()) - self.start, self.steps)
            self.bar.update(done - self.bar.n)

    def __enter__(self) -> RoundBar:
        if not self.bar.disable:
            self.start = ray.get(self.counter.read.remote())
            self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2 * POLL_SECONDS)
        self.bar.close()
