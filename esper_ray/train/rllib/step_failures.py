"""Env steps that raised: what an env runner records of each, and what the driver shows of a round's failures.

RLlib's env runner catches an exception of `env.step`, recreates the env and drops the episode
(`restart_failed_sub_environments`); all it leaves is a count (`num_env_step_failures`, summed since the run
began) and a line in the worker's log, which `esper-ray` keeps off the console unless `--verbose`. So a run
could lose every episode that germinates some blueprint and say only "FAILED env steps 4". Here each failure
is recorded where it happens, through the runner's MetricsLogger (so it reaches the driver with the round's
other metrics): a per-round count, and the exception's type, first line and traceback. The driver names each
distinct error once on the round line and writes its traceback to the run's log.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from esper_ray.contracts import metrics as m

FAILURES_LOG = "env_step_failures.log"
"""The file in a run's folder (a trial's, under `esper-ray ab`) that keeps the tracebacks."""
RECORDED_PER_ROUND = 8
"""Tracebacks an env runner sends per round at most (the newest): an env failing at every step would otherwise
send one per step. The count covers every failure."""


@dataclass(frozen=True)
class StepFailure:
    error: str
    """The exception's type and the first line of its message, e.g. "RuntimeError: Cannot copy between ..."."""
    traceback: str

    @classmethod
    def of(cls, exc: BaseException) -> StepFailure:
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        return cls(error, "".join(traceback.format_exception(exc)))


@dataclass(frozen=True)
class DistinctFailure:
    error: str
    count: int
    """How many of the round's recorded failures raised this error."""
    traceback: str
    """The first one's."""


def record_step_failure(metrics: Any, exc: BaseException) -> None:
    """Runs in the env runner: count the failure and keep its error and traceback for this round's metrics."""
    failure = StepFailure.of(exc)
    metrics.log_value(m.ENV_STEP_FAILURES_ROUND, 1, reduce="sum")
    metrics.log_value(
        m.ENV_STEP_ERRORS, (failure.error, failure.traceback), reduce="item_series", window=RECORDED_PER_ROUND
    )


class StepFailureRecorder(gym.vector.VectorWrapper):
    """Calls `on_failure` with whatever the wrapped env's step raises, then lets it propagate to RLlib."""

    def __init__(self, env: gym.vector.VectorEnv, on_failure: Callable[[BaseException], None]) -> None:
        super().__init__(env)
        self.on_failure = on_failure

    def step(self, actions: Any) -> Any:
        try:
            return self.env.step(actions)
        except Exception as exc:
            self.on_failure(exc)
            raise


def round_failures(result: dict[str, Any]) -> tuple[DistinctFailure, ...]:
    """The round's recorded failures from the algorithm's result, one per distinct error, in order of first arrival."""
    runners = result[m.ENV_RUNNERS] if m.ENV_RUNNERS in result else {}
    items = runners[m.ENV_STEP_ERRORS] if m.ENV_STEP_ERRORS in runners else []
    if not isinstance(items, list):  # RLlib reports a series that received nothing this round as NaN
        items = []
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for error, trace in items:
        first.setdefault(error, trace)
        counts[error] = counts.get(error, 0) + 1
    return tuple(DistinctFailure(error, counts[error], trace) for error, trace in first.items())


def failures_text(failures: tuple[DistinctFailure, ...]) -> str:
    """Each distinct error once, with how often it was recorded: "InjectedFault: ... (2x); ValueError: ..."."""
    return "; ".join(f.error + (f" ({f.count}x)" if f.count > 1 else "") for f in failures)


def traceback_report(round_: int, failures: tuple[DistinctFailure, ...]) -> str:
    """What the run's log keeps of a round's failures: each distinct error's first traceback."""
    parts = [f"round {round_}: {f.count} env step(s) raised {f.error}\n{f.traceback}" for f in failures]
    return "\n".join(parts)


def append_tracebacks(folder: Path, round_: int, failures: tuple[DistinctFailure, ...]) -> Path:
    """Add the round's tracebacks to `folder`/FAILURES_LOG; returns that file."""
    path = folder / FAILURES_LOG
    with path.open("a") as log:
        log.write(traceback_report(round_, failures) + "\n")
    return path
