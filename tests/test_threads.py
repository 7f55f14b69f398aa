"""Every process that steps an env uses the torch threads it was given and says so (train/process/threads.py).

The tests run with OMP_NUM_THREADS=1 (conftest.py), so a process that reports 2 threads set them itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.trainable import MorphoTrial
from esper_ray.experiments.trial_keys import TORCH_THREADS, TRIAL_KEY
from esper_ray.train.process.threads import threads_of_cpus, use_threads

REPO = Path(__file__).resolve().parents[1]


def test_a_process_gets_floor_of_its_cpus_and_at_least_one_thread():
    assert [threads_of_cpus(c) for c in (0.25, 1.0, 1.5, 2.0, 3.9)] == [1, 1, 1, 2, 3]
    with pytest.raises(ValueError, match="threads=0"):
        use_threads(0)


@pytest.mark.parametrize("controller", ["heuristic", "none"])
def test_a_baseline_trial_evaluates_with_the_threads_of_its_cpus_and_reports_them(controller):
    cfg = TrainConfig.from_mapping({"task": "digits-impaired", "max_epochs": 2, "envs": 1, "cpus_per_env": 2})
    config = {
        TRIAL_KEY: {"train": cfg.to_dict(), "controller": controller, "arm": controller, "seed": 0, "eval_episodes": 1}
    }
    before = torch.get_num_threads()
    try:
        trial = MorphoTrial(config)  # outside Tune: its folder under the tests' own HOME
        result = trial.train()  # the trial's one step: its evaluation episodes, in this process
        assert torch.get_num_threads() == 2 and result[TORCH_THREADS] == 2
        trial.stop()
    finally:
        torch.set_num_threads(before)


def test_the_heuristic_command_uses_its_threads_and_says_so_once():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "esper_ray.cli",
            "heuristic",
            "--task",
            "digits-impaired",
            "--max-epochs",
            "1",
            "--episodes",
            "2",
            "--threads",
            "2",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert [row["torch_threads"] for row in json.loads(run.stdout)] == [2, 2]  # read inside the process, per episode
    lines = [
        line for line in run.stderr.splitlines() if "warning: no seed can be kept" not in line
    ]  # 1 epoch: too short
    assert lines[0].endswith("heuristic: 2 episodes of up to 1 epoch (results at the end), torch threads: 2"), (
        run.stderr
    )
    assert run.stderr.count("torch threads") == 1
