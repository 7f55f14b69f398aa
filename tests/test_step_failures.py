"""A failed env step says why: the runner-side wrapper records the error and lets it propagate, and the round
line names each distinct error once with its count. Through a real `esper-ray train` run: test_faults.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from esper_ray.contracts import metrics as m
from esper_ray.train.output.round_summary import progress_line, summarize_round
from esper_ray.train.rllib.step_failures import StepFailure, StepFailureRecorder, record_step_failure, round_failures


class RaisesOnSecondStep(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors\nsecond line, not shown")
        return np.zeros(1, dtype=np.float32), 0.0, False, False, {}


def test_the_wrapper_records_what_the_env_raised_and_lets_it_through():
    seen: list[BaseException] = []
    env = StepFailureRecorder(gym.vector.SyncVectorEnv([RaisesOnSecondStep]), seen.append)
    env.reset(seed=0)
    env.step(np.array([0]))
    with pytest.raises(RuntimeError, match="Cannot copy"):  # RLlib must still see it, to recreate the env
        env.step(np.array([0]))
    assert len(seen) == 1
    failure = StepFailure.of(seen[0])
    assert failure.error == "RuntimeError: Cannot copy between CPU and CUDA tensors"
    assert "Traceback" in failure.traceback and "in step" in failure.traceback and "second line" in failure.traceback


def _round_result(per_runner: list[list[BaseException]], lifetime: int, root: MetricsLogger | None = None) -> dict:
    """A round's result, its env_runners group built the way RLlib builds it from its runners' loggers (`root`
    is the algorithm's logger, which keeps the keys of earlier rounds)."""
    root, leaves = root or MetricsLogger(root=True), []
    for failures in per_runner:
        leaf = MetricsLogger()
        leaf.log_value(m.EPISODES, 1, reduce="sum")
        for exc in failures:
            record_step_failure(leaf, exc)
        leaves.append(leaf.reduce())
    root.aggregate(leaves, key=m.ENV_RUNNERS)
    runners = {k: v.peek() for k, v in root.reduce()[m.ENV_RUNNERS].items()}
    runners[m.ENV_STEP_FAILURES] = lifetime
    return {
        m.ENV_RUNNERS: runners,
        "training_iteration": 3,
        "time_this_iter_s": 1.0,
        "num_env_steps_sampled_lifetime": 10,
    }


def test_the_round_line_names_each_distinct_error_once_with_its_count():
    cuda = RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture\n(more detail)")
    result = _round_result([[cuda, ValueError("masked action: head blueprint")], [cuda]], lifetime=7)
    summary = summarize_round(result)
    assert summary.failed_env_steps == 3 and summary.failed_env_steps_lifetime == 7
    line = progress_line(summary, 5)
    assert line.count("RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture (2x)") == 1
    assert line.count("ValueError: masked action: head blueprint") == 1
    assert "FAILED env steps 3" in line and "more detail" not in line
    assert [f.count for f in round_failures(result)] == [2, 1]


def test_a_round_without_failures_says_nothing_of_them():
    root = MetricsLogger(root=True)
    _round_result([[ValueError("bad")], []], lifetime=1, root=root)
    result = _round_result([[], []], lifetime=1, root=root)  # RLlib reports the emptied series and sum as NaN
    summary = summarize_round(result)
    assert summary.failed_env_steps == 0 and summary.env_step_errors == "" and round_failures(result) == ()
    assert "FAILED" not in progress_line(summary, 5)


def test_a_round_whose_runners_all_died_reports_no_steps_and_no_episodes():
    """A SIGTERM or crash mid-round can leave RLlib's step and episode counts NaN (seen when Ray's processes were
    stopped under the trials); the summary counts them as none instead of raising on int(NaN)."""
    result = _round_result([[], []], lifetime=0)
    result[m.ENV_RUNNERS].update({m.ENV_STEPS_SAMPLED: float("nan"), m.EPISODES: float("nan")})
    summary = summarize_round(result)
    assert summary.env_steps == 0 and summary.episodes == 0
    assert "round 3/5" in progress_line(summary, 5)


def test_an_ab_trials_round_event_names_its_failed_steps():
    from types import SimpleNamespace

    from esper_ray.experiments.runner import TrialEvents
    from esper_ray.experiments.trainable import SUMMARY_PREFIX, TRIAL_KEY

    printed: list[str] = []
    events = TrialEvents(total=2, rounds=5, print_fn=lambda text, flush: printed.append(text))
    trial = SimpleNamespace(config={TRIAL_KEY: {"arm": "ppo", "seed": 3}})
    summary = summarize_round(_round_result([[ValueError("bad blueprint")], []], lifetime=1))
    events.on_trial_result(0, [], trial, {SUMMARY_PREFIX + k: v for k, v in summary.as_dict().items()})
    summary = summarize_round(_round_result([[], []], lifetime=1))
    events.on_trial_result(0, [], trial, {SUMMARY_PREFIX + k: v for k, v in summary.as_dict().items()})
    assert (
        "ppo/seed3 round 3/5" in printed[0]
        and "FAILED env steps 1" in printed[0]
        and "ValueError: bad blueprint" in printed[0]
    )
    assert "FAILED" not in printed[1]


def test_env_runners_built_one_after_another_in_a_process_register_their_env_without_a_warning():
    """RLlib registers each runner's env under one gymnasium name; gymnasium warned `Overriding environment
    rllib-single-agent-env-v0 already in registry` for every runner after the first (the test log repeated it)."""
    import warnings

    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.rllib.env_runner import CpuPolicyEnvRunner
    from esper_ray.train.rllib.ppo_config import build_ppo_config

    cfg = TrainConfig(max_epochs=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index in (1, 2):
            runner = CpuPolicyEnvRunner(config=build_ppo_config(cfg), worker_index=index, num_workers=cfg.envs)
            runner.make_env()  # as RLlib recreates an env after a failed step
            runner.stop()
    overriding = [str(w.message) for w in caught if "Overriding environment" in str(w.message)]
    assert not overriding, overriding
