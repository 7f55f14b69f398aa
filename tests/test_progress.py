"""The progress counter behind `esper-ray train`'s bar: env runners batch their step reports (a remote call per
step cost the default run on 2 cores speed: train/progress.py) and a finished sample is always counted whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from esper_ray.train import progress
from esper_ray.train.progress import PROGRESS_ACTOR_KEY, StepReporter, start_step_counter


class FakeCounter:
    """Stands for the StepCounter actor handle: records each `add.remote(n)` call."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.add = SimpleNamespace(remote=self.calls.append)


def reporter_with(counter: FakeCounter, monkeypatch: Any) -> tuple[StepReporter, Any]:
    monkeypatch.setattr(progress.ray, "get_actor", lambda name: counter)
    runner = SimpleNamespace(config=SimpleNamespace(learner_config_dict={PROGRESS_ACTOR_KEY: "steps"}))
    return StepReporter(), runner


def test_steps_within_the_report_interval_go_out_in_one_call_and_a_flush_sends_the_rest(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    counter = FakeCounter()
    reporter, runner = reporter_with(counter, monkeypatch)
    reporter.step(runner)  # the first step goes out at once: the bar starts moving
    for _ in range(9):
        clock[0] += progress.REPORT_SECONDS / 10
        reporter.step(runner)
    assert counter.calls == [1]
    clock[0] += progress.REPORT_SECONDS
    reporter.step(runner)
    assert counter.calls == [1, 10]
    reporter.step(runner)
    reporter.flush()  # the end of a sample: nothing is left behind for the next round
    assert counter.calls == [1, 10, 1] and sum(counter.calls) == 12
    reporter.flush()
    assert counter.calls == [1, 10, 1]  # nothing pending, no call


def test_without_a_counter_the_reporter_sends_nothing(monkeypatch):
    runner = SimpleNamespace(config=SimpleNamespace(learner_config_dict={PROGRESS_ACTOR_KEY: None}))
    reporter = StepReporter()
    for _ in range(5):
        reporter.step(runner)
    reporter.flush()
    assert reporter.counter is None and reporter.pending == 0


def test_no_counter_is_started_where_no_bar_can_be_drawn(monkeypatch):
    monkeypatch.setattr(progress.sys, "stderr", SimpleNamespace(isatty=lambda: False))
    assert start_step_counter() == (None, None)
