"""Where a PPO trial's setup goes (train/rllib/env_runner.py, runner_start_seconds): its env runners' processes coming
up, then their own init. The whole path (an A/B's progress line) is checked in test_experiments.py's smoke run."""

from __future__ import annotations

from types import SimpleNamespace

from esper_ray.train.rllib.env_runner import runner_start_seconds


class FakeRunnerGroup:
    """foreach_env_runner over remote runners that hold `init_stamps` (None: a runner of another class)."""

    def __init__(self, stamps):
        self.runners = [SimpleNamespace(init_stamps=s) if s is not None else SimpleNamespace() for s in stamps]

    def foreach_env_runner(self, func, *, local_env_runner=True):
        assert local_env_runner is False  # the driver's local runner has no env and no process of its own
        return [func(runner) for runner in self.runners]


def test_the_last_runner_up_and_the_longest_init_count():
    """Build began at 100: runners up at 103 and 108 (the last: 8 s), built in 2 and 1.5 s (the longest: 2 s)."""
    group = FakeRunnerGroup([(103.0, 105.0), (108.0, 109.5), None])
    assert runner_start_seconds(group, since=100.0) == (8.0, 2.0)


def test_no_remote_runner_of_ours_says_nothing():
    assert runner_start_seconds(FakeRunnerGroup([]), since=0.0) is None
    assert runner_start_seconds(FakeRunnerGroup([None]), since=0.0) is None
