"""RLlib's env runner with the policy on the CPU, whatever GPU share the runner has, cuDNN left fast, and every
failed env step recorded.

The env trains its host on the runner's GPU share, on the node's least-loaded GPU (gpu_spread.py: Ray would stack
every fractional share on the first GPU with room). The policy is a small LSTM that acts once per host epoch:
on a GPU shared by several env processes, each of its forward passes is a few tiny kernels queued behind the
other processes' time slices, plus a sync to bring the action back (RLlib's own timers on an H200 shared by
4 envs: 40-110 ms per step for inference and action sampling); on the CPU it is about a millisecond, and it
leaves the GPU to the host's training.

RLlib also switches cuDNN to its deterministic algorithms in every seeded worker (`set_torch_seed`), which made
the env's training phase 3x slower inside an env runner than in a bare process (0.197 against 0.067 s per epoch
on an H200 shared by 4 envs). The env's own `cudnn_deterministic` setting (off by default) decides instead.

An env step that raises costs its episode, and RLlib keeps only a count and a worker log line: the runner
wraps its env so that each failure's error and traceback reach the driver (step_failures.py).

Each sample call's wall time is logged (min, mean and max over the round's runners): a round ends with its
slowest runner, so max - mean is what the synchronous round costs the others, which bare envs never pay.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override

from esper_ray.contracts import metrics as m
from esper_ray.train.gpu_spread import spread_gpu
from esper_ray.train.step_failures import StepFailureRecorder, record_step_failure


class CpuPolicyEnvRunner(SingleAgentEnvRunner):
    @override(SingleAgentEnvRunner)
    def __init__(self, *args: Any, config: AlgorithmConfig, **kwargs: Any) -> None:
        started = time.time()  # wall clock: the trial compares it with its own (runner_start_seconds)
        spread_gpu()  # before anything starts CUDA in this process
        # RLlib would build the policy and its connectors on the runner's GPU: told it has none, it keeps them on the
        # CPU (and never maps Ray's GPU id to a device, which spread_gpu may have moved); the env still takes the
        # runner's GPU share through its own `device` setting.
        cpu_policy = config.copy(copy_frozen=False)
        cpu_policy.num_gpus_per_env_runner = 0
        super().__init__(*args, config=cpu_policy, **kwargs)
        torch.backends.cudnn.deterministic = bool(self.config.env_config.get("cudnn_deterministic", False))
        self.init_stamps = (started, time.time())  # its process was up (imports done) at the first, built at the second

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        # RLlib calls this again after a failed step (to recreate the env), so each new env is wrapped too.
        super().make_env()
        self.env = StepFailureRecorder(self.env, lambda exc: record_step_failure(self.metrics, exc))

    @override(SingleAgentEnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        episodes = super().sample(*args, **kwargs)
        seconds = time.perf_counter() - started
        for key, reduce in ((m.RUNNER_SAMPLE_SECONDS_MIN, "min"), (m.RUNNER_SAMPLE_SECONDS, "mean"), (m.RUNNER_SAMPLE_SECONDS_MAX, "max")):
            self.metrics.log_value(key, seconds, reduce=reduce)
        return episodes


def runner_start_seconds(env_runner_group: Any, since: float) -> tuple[float, float] | None:
    """Where a trial's start went, from its remote runners' init_stamps: seconds from `since` (time.time() when the
    algorithm's build began) until the last runner's process was up with its imports done, and the longest runner
    init after that (env, GPU share, policy). None without remote CpuPolicyEnvRunners."""
    stamps = [s for s in env_runner_group.foreach_env_runner(lambda runner: getattr(runner, "init_stamps", None),
                                                              local_env_runner=False) if s is not None]
    if not stamps:
        return None
    return max(start for start, _ in stamps) - since, max(end - start for start, end in stamps)
