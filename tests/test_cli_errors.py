"""Mistakes on the command line end in one clear line that names the setting, before Ray starts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from esper_ray.cli import main
from esper_ray.contracts.actions import joint_size
from esper_ray.env import MorphogeneticEnv


def error_of(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]  # argparse's own errors come after its usage lines


def no_ray_may_start(monkeypatch) -> None:
    """Make starting (or joining) Ray from `train` or `ab` fail the test: what is checked is checked before."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command went on to start Ray")

    monkeypatch.setattr("esper_ray.train.commands.runner.connect_ray", refuse)
    monkeypatch.setattr("esper_ray.experiments.runner.connect_ray", refuse)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--slots", "r9c9"], "bad slot name 'r9c9'"),
        (["--slots", "r1c4"], "slot 'r1c4' does not exist in this host"),
        (["--slots", "r0c0", "r0c0"], "names a slot twice"),
        (
            ["--task", "cifar10"],
            "task cifar10 needs data_dir, a folder holding cifar-10-batches-py/: give --env data_dir=DIR",
        ),
        (["--env", "device=cuda"], "env device='cuda' but gpus_per_env=0"),
        (["--env", "batch_size=0"], "batch_size=0: must be an integer >= 1"),
        (["--envs", "two"], "invalid int value: 'two'"),
        (["--mps"], "mps=True shares a GPU between env processes, but gpus_per_env=0"),
        (["--seed", str(2**32)], "seed=4294967296: must be below 2**32 - envs"),  # crashed inside Ray before
    ],
)
def test_bad_train_settings_end_in_one_line_before_ray_starts(args, expected, capsys, tmp_path):
    import ray

    assert expected in error_of(["train", *args, "--output", str(tmp_path / "run")], capsys)
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--max-epochs", "99999999999999999999999"], "max_epochs=1e+23: must be an integer <= 10,000"),
        (["--max-epochs", "20000"], "max_epochs=20,000: must be an integer <= 10,000"),
        (["--rounds", str(10**30)], "rounds=1e+30: must be an integer <= 100,000"),
        (["--envs", str(10**9)], "envs=1,000,000,000: must be an integer <= 100,000"),
        (["--env", "batch_size=99999999999999999999"], "batch_size=1e+20: must be an integer <= 4,294,967,295"),
    ],
)
def test_counts_past_their_bound_are_refused_naming_the_bound(args, expected, capsys, tmp_path, monkeypatch):
    """A count with no upper bound ran for ever with no progress line (issue 69, item 9)."""
    no_ray_may_start(monkeypatch)
    assert expected in error_of(["train", *args, "--output", str(tmp_path / "run")], capsys)


def test_an_episode_count_past_its_bound_is_refused_naming_the_bound(capsys, tmp_path):
    assert "--episodes=1e+15: must be an integer <= 100,000" in error_of(
        ["eval", "--checkpoint", str(tmp_path / "run"), "--episodes", str(10**15)], capsys
    )


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"rounds": 10**30}, "rounds=1e+30: must be an integer <= 100,000"),
        ({"training": {"max_epochs": 99999999999999999999999}}, "max_epochs=1e+23: must be an integer <= 10,000"),
        ({"eval_episodes": 10**6}, "eval_episodes=1,000,000: must be an integer <= 100,000"),
    ],
)
def test_experiment_counts_past_their_bound_are_refused_naming_the_bound(
    change, expected, tmp_path, capsys, monkeypatch
):
    import json

    no_ray_may_start(monkeypatch)

    experiment = tmp_path / "x.yaml"
    experiment.write_text(
        json.dumps({"name": "t", "arms": {"a": {}, "b": {"controller": "none"}}, "seeds": [0], "rounds": 2, **change})
    )
    assert expected in error_of(["ab", str(experiment), "--output", str(tmp_path / "run")], capsys)


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


@pytest.mark.parametrize(
    "position, value, expected",
    [
        (0, 999, f"action head op_slot=999: out of range [0, {joint_size()})"),
        (6, -1, "action head alpha_curve=-1: out of range [0, 5)"),
        (0, 2.9, "action head op_slot=2.9: must be a whole number"),
    ],
)
def test_actions_out_of_range_or_fractional_name_the_head(position, value, expected):
    env = MorphogeneticEnv({"task": "digits", "max_epochs": 3, "num_shards": 6})
    env.reset(seed=0)
    action = np.zeros(7, dtype=float)
    action[position] = value
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        env.step(action)


def test_a_bad_experiment_file_is_refused_before_ray_is_imported(tmp_path):
    """Importing Ray and Tune first made a typo in an experiment file cost 13-28 s on a busy machine (issue 69,
    item 11): the file is checked with the spec module alone."""
    import json
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"name": "t", "arms": {"a": {}, "b": {"controller": "none"}}, "seeds": [0], "rounds": 0}))
    code = (
        "import sys\nfrom esper_ray.cli import main\ntry:\n    main(['ab', sys.argv[1]])\nexcept SystemExit as e:\n"
        "    print(e.code, 'ray' in sys.modules, 'ray.tune' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    assert "rounds=0: must be an integer >= 1" in done.stderr


def test_bad_arguments_of_train_eval_grow_and_ab_are_refused_before_ray_is_imported(tmp_path):
    """train, eval and grow imported Ray first (30-165 s to refuse on a busy machine, issue 74), and a checkpoint arm
    was checked for its first seed only, after Ray started: each mistake is one line, exit 2, with no `ray` module
    loaded. One process runs every command (importing torch once)."""
    import json
    import subprocess
    import sys

    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.folders.checkpoints import record_checkpoint
    from esper_ray.train.rllib.rounds import MODULE_PATH

    run = tmp_path / "run"  # a training run's folder with one checkpoint, as `train` writes it (no pickles needed)
    (run / "checkpoints" / "round_00001.partial").mkdir(parents=True)
    record_checkpoint(run, TrainConfig(), run / "checkpoints" / "round_00001.partial", 1)
    (tmp_path / "ck0" / MODULE_PATH).mkdir(parents=True)  # seed 0's checkpoint arm folder; seed 1's is missing
    (tmp_path / "a file").write_text("")

    def experiment(path: str) -> str:
        file = tmp_path / f"e{abs(hash(path))}.yaml"
        file.write_text(
            json.dumps(
                {
                    "name": "t",
                    "seeds": [0, 1],
                    "arms": {"a": {"controller": "none"}, "b": {"controller": "checkpoint", "checkpoint": path}},
                }
            )
        )
        return str(file)

    commands = [
        (["train", "--env", "batch_size=0"], "batch_size=0: must be an integer >= 1"),
        (["train", "--slots", "r1c4"], "slot 'r1c4' does not exist in this host"),
        (["train", "--output", str(tmp_path / "a file" / "run")], "cannot be written (Not a directory"),
        (["train", "--resume", str(tmp_path / "none")], "no esper-ray checkpoint at"),
        (["eval", "--checkpoint", str(tmp_path / "none")], "no esper-ray checkpoint at"),
        (["grow", str(tmp_path / "none"), "--host", "digits"], "no esper-ray checkpoint at"),
        (
            ["grow", str(run), "--host", "tests.plugin_parts:ToyMLP"],
            "no registered task lists it as its own host, so the data it grows on must be named: "
            "add --task NAME, NAME one of",
        ),
        (["ab", experiment(str(tmp_path / "ck{seed}"))], f"(seed 1): {tmp_path / 'ck1'} does not exist"),
        (["ab", experiment(str(run))], "is a training run's folder, not one of its checkpoints; give one of"),
        (
            ["ab", experiment("..")],
            "is not a checkpoint folder (no learner_group/learner/rl_module/default_policy in it)",
        ),
        (["ab", experiment(str(tmp_path / "a file"))], "is a file, not a folder"),
        (["ab", experiment("t{seed}}{")], "the only field a checkpoint path may hold is {seed}"),
    ]
    code = (
        "import json, sys\nfrom esper_ray.cli import main\nfor args in json.loads(sys.argv[1]):\n    try:\n"
        "        main(args + (['--output', sys.argv[2]] "
        "if args[0] in ('train', 'ab') and '--output' not in args else []))\n"
        "    except SystemExit as e:\n        print(e.code, 'ray' in sys.modules, file=sys.stderr, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps([a for a, _ in commands]), str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # `tests.plugin_parts` importable there
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 * len(commands), done.stderr
    for (args, expected), error, exit_line in zip(commands, lines[::2], lines[1::2]):
        assert expected in error and exit_line == "2 False", (args, error, exit_line)
