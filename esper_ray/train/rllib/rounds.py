"""One training round, started the same way whether the run is fresh or resumed.

Before each round every env runner tells its env the round number; from then on each episode's host and the
runner's action sampling start from seeds fixed by (seed, shard, round, episode), not by what ran before. So
the rounds after a resume from round k's checkpoint replay rounds k+1, k+2, ... of the uninterrupted run
(exactly on CPU, where the update is deterministic, as long as episodes end at round boundaries: no governor
rollback cut one short).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esper_ray.policy.layout import LAYOUT_KEY, architecture_of, check_layout, saved_layout

MODULE_PATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"
"""Where a checkpoint keeps the policy module (evaluate.py loads it from there)."""


def train_round(algo: Any) -> dict[str, Any]:
    """algo.train() for the next round, with every env runner started on it first (a runner already sampling that
    round ahead leaves it be: CpuPolicyEnvRunner.start_round)."""
    round_ = algo.iteration + 1
    algo.env_runner_group.foreach_env_runner(lambda runner: runner.start_round(round_), local_env_runner=False)
    return algo.train()


def restore(algo: Any, path: str) -> None:
    """Load a checkpoint into `algo` (weights, optimizer, filters, normaliser, iteration) and hand its filter and
    weights to every remote env runner. A checkpoint of another policy layout, or of another architecture than
    `algo`'s network (TrainConfig.policy), is refused first (policy/layout.py)."""
    architecture = architecture_of((algo.config.rl_module_spec.model_config or {}).get(LAYOUT_KEY))
    check_layout(saved_layout(Path(path) / MODULE_PATH), f"checkpoint {path}", architecture)
    algo.restore_from_path(path)
    push_state_to_runners(algo)


def push_state_to_runners(algo: Any) -> None:
    """Give every remote env runner the algorithm's observation filter and weights, and wait until they hold them.

    RLlib's restore sends the filter states, then the weights, both fire-and-forget, and its actor manager silently
    skips the second for a runner that has not answered the first (one request in flight per runner): a resumed
    run then often sampled its first round with the initial weights. Waiting for every answer before each send
    makes both arrive.
    """
    group = algo.env_runner_group
    group.fetch_ready_async_reqs(timeout_seconds=None)
    group.sync_env_runner_states(config=algo.config, from_worker=algo.env_runner)
    group.fetch_ready_async_reqs(timeout_seconds=None)
    group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True, timeout_seconds=None)
    group.fetch_ready_async_reqs(timeout_seconds=None)
