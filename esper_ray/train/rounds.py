"""One training round, started the same way whether the run is fresh or resumed.

Before each round every env runner reseeds its random generators (action sampling) and tells its env the
round number (episode seeds), both from (seed, round, runner): so the rounds after a resume from round k's
checkpoint replay the rounds k+1, k+2, ... of the uninterrupted run (exactly on CPU, where the update is
deterministic, as long as episodes end at round boundaries: no governor rollback cut one short).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def round_seed(seed: int, round_: int, worker_index: int) -> int:
    return int(np.random.default_rng([seed, round_, worker_index]).integers(2**31))


def start_round_on(runner: Any, round_: int, seed: int) -> None:
    """Runs inside an env runner: reseed its generators and its env for round `round_`."""
    value = round_seed(seed, round_, runner.worker_index)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    for env in runner.env.unwrapped.envs:
        env.unwrapped.start_round(round_)


def train_round(algo: Any, seed: int) -> dict[str, Any]:
    """algo.train() for the next round, with every env runner started on it first."""
    round_ = algo.iteration + 1
    algo.env_runner_group.foreach_env_runner(lambda runner: start_round_on(runner, round_, seed), local_env_runner=False)
    return algo.train()
