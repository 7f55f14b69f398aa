"""measurements/policy_probe.py finds the run it watches: an A/B trial's folder or an `esper-ray train` output folder,
the newest checkpoint unless one is named. (The probe itself runs in the smoke A/B test of test_experiments.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.trial_keys import TRIAL_KEY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))
from policy_probe import run_of  # noqa: E402

from tests.test_checkpoints import run_with_rounds  # noqa: E402


def test_a_training_run_gives_its_newest_checkpoint_and_that_checkpoints_settings(tmp_path):
    output = run_with_rounds(tmp_path, 5, 10)
    cfg, checkpoint = run_of(output, None)
    assert checkpoint.name == "round_00010" and cfg == TrainConfig()
    cfg, checkpoint = run_of(output, output / "checkpoints" / "round_00005")
    assert checkpoint.name == "round_00005"


def test_an_ab_trial_gives_its_latest_checkpoint_and_its_params(tmp_path):
    trial = tmp_path / "ppo_seed3_abc_00001"
    for name in ("checkpoint_000009", "checkpoint_000011"):
        (trial / name).mkdir(parents=True)
    (trial / "params.json").write_text(json.dumps({TRIAL_KEY: {"train": {"task": "text", "seed": 3, "envs": 4}}}))
    cfg, checkpoint = run_of(trial, None)
    assert checkpoint.name == "checkpoint_000011" and (cfg.task, cfg.seed, cfg.envs) == ("text", 3, 4)


def test_a_folder_that_is_neither_is_one_line_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=f"--trial {tmp_path}: neither an A/B trial's folder"):
        run_of(tmp_path, None)
