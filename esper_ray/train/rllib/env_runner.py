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

With ESPER_RAY_PROFILE_SAMPLING set to a folder, each runner profiles its sample calls (cProfile) and writes one
file a call there (runner_<index>_call_<n>.prof): where a step's time off the card goes inside a real run
(`benchmarks/throughput.py --profile-runners`).

With TrainConfig.lead the driver asks for a round through `sample_round`, which may also start the next round
in a background thread of the runner (the same thread for every round: background.WorkerThread), so that it
samples while the others finish, the driver collects the episodes and sends new weights. For runs to replay, what
a leading round samples must not depend on timing: it runs with the state the runner holds when it starts, that
is the state sent after the round before the one just finished; whatever the driver sends while it runs
(weights, the merged observation filter) is held and put in place when the round it leads is handed over; and the
driver's filter merge reads the features of the round handed over, not those of the round being sampled ahead.
"""

from __future__ import annotations

import cProfile
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override

from esper_ray.contracts import metrics as m
from esper_ray.policy.feature_filter import feature_filter_of
from esper_ray.train.process.background import InBackground, WorkerThread
from esper_ray.train.process.gpu_spread import single_visible_gpu, spread_gpu
from esper_ray.train.rllib.env_factory import RUNNER_KEY
from esper_ray.train.rllib.step_failures import StepFailureRecorder, record_step_failure

RLLIB_ENV_ID = "rllib-single-agent-env-v0"
"""The gymnasium name SingleAgentEnvRunner.make_env registers each runner's env under."""
PROFILE_ENV = "ESPER_RAY_PROFILE_SAMPLING"
"""A folder: every env runner profiles each sample call into it (see the module doc)."""


class CpuPolicyEnvRunner(SingleAgentEnvRunner):
    @override(SingleAgentEnvRunner)
    def __init__(self, *args: Any, config: AlgorithmConfig, **kwargs: Any) -> None:
        started = time.time()  # wall clock: the trial compares it with its own (runner_start_seconds)
        spread_gpu()  # before anything starts CUDA in this process
        self._gpu = single_visible_gpu() if config.num_gpus_per_env_runner > 0 else None
        """The GPU its envs train on, by id (None on the CPU): its sample calls are also timed under that id."""
        # RLlib would build the policy and its connectors on the runner's GPU: told it has none, it keeps them on the
        # CPU (and never maps Ray's GPU id to a device, which spread_gpu may have moved); the env still takes the
        # runner's GPU share through its own `device` setting.
        cpu_policy = config.copy(copy_frozen=False)
        cpu_policy.num_gpus_per_env_runner = 0
        if config.num_envs_per_env_runner > 1:  # the vector env's shards follow the runner's index (env_factory.py)
            runner = (kwargs.get("worker_index") or 0, kwargs.get("num_workers", config.num_env_runners))
            cpu_policy.env_config = {**config.env_config, RUNNER_KEY: runner}
        super().__init__(*args, config=cpu_policy, **kwargs)
        torch.backends.cudnn.deterministic = bool(self.config.env_config.get("cudnn_deterministic", False))
        self._lead: InBackground | None = None
        """The next round, sampled ahead (TrainConfig.lead); None when none runs."""
        self._lead_round = 0
        self._lead_thread: WorkerThread | None = None
        """Where every round sampled ahead runs: one thread for all of them (see WorkerThread)."""
        self._held: list[dict[str, Any]] = []
        """States the driver sent while a round was sampled ahead, in order: put in place when it is handed over."""
        self._reported: dict[str, Any] | None = None
        """The connector states as the last round handed over ended, for the driver's filter merge of that round."""
        self.init_stamps = (started, time.time())  # its process was up (imports done) at the first, built at the second
        self._profiles = Path(os.environ[PROFILE_ENV]) if os.environ.get(PROFILE_ENV) else None
        self._sample_calls = 0

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        # RLlib registers every runner's env under one gymnasium name, bound to that runner's env context, and makes
        # it at once; a second runner in the process (the driver's local one, a test's, a recreated env) would
        # override the entry with a UserWarning. The old entry is only ever the previous runner's: drop it first.
        gym.registry.pop(RLLIB_ENV_ID, None)
        # RLlib calls this again after a failed step (to recreate the env), so each new env is wrapped too.
        super().make_env()
        self.env = StepFailureRecorder(self.env, lambda exc: record_step_failure(self.metrics, exc))

    @override(SingleAgentEnvRunner)
    def sample(self, *args: Any, **kwargs: Any) -> Any:
        self._sample_calls += 1
        profile = cProfile.Profile() if self._profiles is not None else None
        started = time.perf_counter()
        episodes = profile.runcall(super().sample, *args, **kwargs) if profile else super().sample(*args, **kwargs)
        seconds = time.perf_counter() - started
        if profile is not None and self._profiles is not None:
            self._profiles.mkdir(parents=True, exist_ok=True)
            profile.dump_stats(self._profiles / f"runner_{self.worker_index}_call_{self._sample_calls}.prof")
        for key, reduce in (
            (m.RUNNER_SAMPLE_SECONDS_MIN, "min"),
            (m.RUNNER_SAMPLE_SECONDS, "mean"),
            (m.RUNNER_SAMPLE_SECONDS_MAX, "max"),
        ):
            self.metrics.log_value(key, seconds, reduce=reduce)
        if self._gpu is not None:
            self.metrics.log_value(m.RUNNER_SAMPLE_SECONDS_ON_GPU + self._gpu, seconds, reduce="mean")
        return episodes

    # -------------------------------------------------------------------- leading rounds (TrainConfig.lead)
    def sample_round(self, lead_round: int | None) -> tuple[list[Any], dict[str, Any]]:
        """This round's episodes and metrics, as sample() then get_metrics() give them; the episodes come from the
        round sampled ahead if one runs. With `lead_round`, that round's sampling then starts in the background."""
        lead, self._lead = self._lead, None
        episodes = lead.result() if lead is not None else self.sample()  # result() re-raises what stopped it
        self.metrics.log_value(m.RUNNER_ROUND_LED, float(lead is not None), reduce="mean")
        metrics = self.get_metrics()
        self._reported = super().get_state(
            components=[COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR]
        )
        feature_filter_of(self._env_to_module, f"env runner {self.worker_index}").start_next_report()
        held, self._held = self._held, []
        for state in held:
            super().set_state(state)
        if lead_round is not None:
            self.start_round(lead_round)
            self._lead_round = lead_round
            if self._lead_thread is None:
                self._lead_thread = WorkerThread("esper-ray-lead")
            self._lead = InBackground(self.sample, "esper-ray-lead", self._lead_thread)
        return episodes, metrics

    def start_round(self, round_: int) -> None:
        """Start the envs on training round `round_` (train/rllib/rounds.py); a no-op for the round already sampled
        ahead."""
        if self._lead is not None:
            if round_ != self._lead_round:
                raise RuntimeError(f"asked to start round {round_} while sampling round {self._lead_round} ahead")
            return
        for env in self.env.unwrapped.envs:
            env.unwrapped.start_round(round_)

    @override(SingleAgentEnvRunner)
    def set_state(self, state: dict[str, Any]) -> None:
        if self._lead is not None:
            self._held.append(state)  # put in place when the round sampled ahead is handed over
            return
        if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
            self._reported = None  # the merge it reported for has been sent back
        super().set_state(state)

    @override(SingleAgentEnvRunner)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        if self._reported is None:
            return super().get_state(components, not_components=not_components, **kwargs)
        # the connectors as the last round handed over ended (a round sampled ahead may be pushing into them now)
        connectors = [COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR]
        skipped = [*connectors, *([not_components] if isinstance(not_components, str) else not_components or [])]
        state = super().get_state(components, not_components=skipped, **kwargs)
        for key in connectors:
            if self._check_component(key, components, not_components):
                state[key] = self._reported[key]
        return state


def runner_start_seconds(env_runner_group: Any, since: float) -> tuple[float, float] | None:
    """Where a trial's start went, from its remote runners' init_stamps: seconds from `since` (time.time() when the
    algorithm's build began) until the last runner's process was up with its imports done, and the longest runner
    init after that (env, GPU share, policy). None without remote CpuPolicyEnvRunners."""
    stamps = [
        s
        for s in env_runner_group.foreach_env_runner(
            lambda runner: getattr(runner, "init_stamps", None), local_env_runner=False
        )
        if s is not None
    ]
    if not stamps:
        return None
    return max(start for start, _ in stamps) - since, max(end - start for start, end in stamps)
