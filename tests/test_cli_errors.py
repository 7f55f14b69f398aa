"""Mistakes on the command line end in one clear line that names the setting, before Ray starts."""

from __future__ import annotations

import numpy as np
import pytest

from esper_ray.cli import main
from esper_ray.env import MorphogeneticEnv


def error_of(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]  # argparse's own errors come after its usage lines


@pytest.mark.parametrize("args, expected", [
    (["--slots", "r9c9"], "bad slot name 'r9c9'"),
    (["--slots", "r1c4"], "slot 'r1c4' does not exist in this host"),
    (["--slots", "r0c0", "r0c0"], "names a slot twice"),
    (["--task", "cifar10"], "task cifar10 needs data_dir, a folder holding cifar-10-batches-py/: give --env data_dir=DIR"),
    (["--env", "device=cuda"], "env device='cuda' but gpus_per_env=0"),
    (["--env", "batch_size=0"], "batch_size=0: must be an integer >= 1"),
    (["--envs", "two"], "invalid int value: 'two'"),
    (["--mps"], "mps=True shares a GPU between env processes, but gpus_per_env=0"),
    (["--seed", str(2**32)], "seed=4294967296: must be below 2**32 - envs"),  # crashed inside Ray before
])
def test_bad_train_settings_end_in_one_line_before_ray_starts(args, expected, capsys, tmp_path):
    import ray

    assert expected in error_of(["train", *args, "--output", str(tmp_path / "run")], capsys)
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def test_cifar_folder_with_garbage_is_one_line(capsys, tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(b"garbage")
    assert "unreadable" in error_of(["heuristic", "--task", "cifar10", "--data-dir", str(tmp_path)], capsys)


def test_config_files_empty_broken_or_not_files_are_named(capsys, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert f"{empty}: the config file is empty" in error_of(["train", "--config", str(empty)], capsys)
    broken = tmp_path / "broken.yaml"
    broken.write_text("rounds: 2\nenvs: [1, 2\n")
    assert f"{broken}:3:1: invalid YAML" in error_of(["train", "--config", str(broken)], capsys)
    assert "is not a file" in error_of(["train", "--config", str(tmp_path)], capsys)
    output_file = tmp_path / "taken"
    output_file.write_text("x")
    assert "is a file; give a folder for the run" in error_of(["train", "--output", str(output_file)], capsys)


def test_flags_are_never_abbreviated(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--round", "3"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --round 3" in capsys.readouterr().err


@pytest.mark.parametrize("position, value, expected", [
    (0, 99, "action head op_slot=99: out of range [0, 16)"),
    (6, -1, "action head alpha_curve=-1: out of range [0, 5)"),
    (0, 2.9, "action head op_slot=2.9: must be a whole number"),
])
def test_actions_out_of_range_or_fractional_name_the_head(position, value, expected):
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 3, "num_shards": 6})
    env.reset(seed=0)
    action = np.zeros(7, dtype=float)
    action[position] = value
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        env.step(action)
