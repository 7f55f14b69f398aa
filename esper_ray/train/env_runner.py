"""RLlib's env runner with the policy on the CPU, whatever GPU share the runner has, cuDNN left fast, and every
failed env step recorded.

The env trains its host on the runner's GPU share. The policy is a small LSTM that acts once per host epoch:
on a GPU shared by several env processes, each of its forward passes is a few tiny kernels queued behind the
other processes' time slices, plus a sync to bring the action back (RLlib's own timers on an H200 shared by
4 envs: 40-110 ms per step for inference and action sampling); on the CPU it is about a millisecond, and it
leaves the GPU to the host's training.

RLlib also switches cuDNN to its deterministic algorithms in every seeded worker (`set_torch_seed`), which made
the env's training phase 3x slower inside an env runner than in a bare process (0.197 against 0.067 s per epoch
on an H200 shared by 4 envs). The env's own `cudnn_deterministic` setting (off by default) decides instead.

An env step that raises costs its episode, and RLlib keeps only a count and a worker log line: the runner
wraps its env so that each failure's error and traceback reach the driver (step_failures.py).
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override

from esper_ray.train.step_failures import StepFailureRecorder, record_step_failure

CPU = torch.device("cpu")


class CpuPolicyEnvRunner(SingleAgentEnvRunner):
    @override(SingleAgentEnvRunner)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        torch.backends.cudnn.deterministic = bool(self.config.env_config.get("cudnn_deterministic", False))
        if torch.device(self._device) != CPU:
            self._device = CPU
            if self.module is not None:
                self.module.to(CPU)
            # The env-to-module pipeline builds its tensors on the device it was made for: make it anew for the CPU
            # (nothing is lost: no observation has passed through it yet).
            self._env_to_module = self.config.build_env_to_module_connector(env=self.env, spaces=self.spaces, device=CPU)

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        # RLlib calls this again after a failed step (to recreate the env), so each new env is wrapped too.
        super().make_env()
        self.env = StepFailureRecorder(self.env, lambda exc: record_step_failure(self.metrics, exc))
