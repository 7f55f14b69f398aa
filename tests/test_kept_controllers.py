"""Keeping an A/B's controllers (experiments/kept_controllers.py): each seed's last checkpoint, cut down to the policy
module and the observation filter, with its trial's settings and a manifest, is a checkpoint `eval` and `grow` take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.kept_controllers import keep_controllers, main
from esper_ray.train.folders.checkpoints import load_checkpoint_config, resolve_checkpoint, round_of

EXPERIMENT = {
    "name": "keep",
    "arms": {"ppo": {"controller": "ppo", "policy": "slots"}, "none": {"controller": "none"}},
    "seeds": [0, 3],
    "rounds": 4,
    "last_rounds": 1,
    "training": {"task": "digits-impaired", "max_epochs": 5, "prune_logit": -3.0},
}
MODULE = "learner_group/learner/rl_module/default_policy"
FILTER = "env_runner/env_to_module_connector"


def ab_output(root: Path) -> Path:
    """An `esper-ray ab` folder as far as keeping reads it: experiment.json and two checkpoints per PPO trial."""
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps({"experiment": EXPERIMENT}))
    for seed in EXPERIMENT["seeds"]:
        for number in (9, 10):  # by number, not by name: checkpoint_000010 is the last
            checkpoint = root / "tune" / f"ppo_seed{seed}_ab12_0000{seed}" / f"checkpoint_{number:06d}"
            for part in (MODULE, FILTER, f"{FILTER}/FeatureMeanStdFilter", "learner_group/learner", "env_runner"):
                (checkpoint / part).mkdir(parents=True, exist_ok=True)
                (checkpoint / part / "state.pkl").write_bytes(f"{part} {seed} {number}".encode())
            (checkpoint / "round.json").write_text(json.dumps({"round": number // 10 * 4, "summary": {}}))
            (checkpoint / "files.json").write_text("{}")  # the trial's own manifest, rewritten on keeping
    return root


def test_each_seeds_last_checkpoint_is_kept_cut_down_with_its_trials_settings(tmp_path):
    dest = tmp_path / "controllers"
    kept = keep_controllers(ab_output(tmp_path / "out"), "ppo", dest)
    assert kept == [dest / "seed0", dest / "seed3"]
    for seed, folder in zip((0, 3), kept):
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert files == [
            f"{FILTER}/FeatureMeanStdFilter/state.pkl",
            f"{FILTER}/state.pkl",
            "files.json",
            f"{MODULE}/state.pkl",
            "round.json",
            "train_config.json",
        ]
        assert (folder / MODULE / "state.pkl").read_text() == f"{MODULE} {seed} 10"  # the last checkpoint's
        assert resolve_checkpoint(folder) == folder and round_of(folder) == 4
        # as its trial ran: one env a runner, the split a run recorded before envs_per_runner took (from_record)
        expected = TrainConfig.from_record({**EXPERIMENT["training"], "policy": "slots", "seed": seed, "rounds": 4})
        assert load_checkpoint_config(folder) == expected


def test_keeping_refuses_an_arm_that_is_not_there_and_a_folder_that_exists(tmp_path, capsys):
    output = ab_output(tmp_path / "out")
    with pytest.raises(ValueError, match=r"arm='ppo2': not an arm of .*; arms: \['ppo', 'none'\]"):
        keep_controllers(output, "ppo2", tmp_path / "c")
    (tmp_path / "c" / "seed0").mkdir(parents=True)
    assert main([str(output), "ppo", str(tmp_path / "c")]) == 2
    assert "seed0: exists already" in capsys.readouterr().err
