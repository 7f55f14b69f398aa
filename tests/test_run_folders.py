"""Run folders as a careful user meets them (issue 69): one writer at a time, an unusable --output refused before
Ray starts, and the commands printed to resume a run work as pasted, whatever the folder is called. No Ray: the
commands stop before it, or the part that would start it is a stand-in."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from esper_ray.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_printed_resume_commands_are_shell_quoted(tmp_path, capsys, monkeypatch):
    """`resume with: esper-ray ab with space/my exp.yaml --output ...` failed as pasted (issue 69, item 7)."""
    from esper_ray.experiments import runner
    from esper_ray.train.commands.runner import TrainingOutcome, format_outcome

    folder = tmp_path / "with space"
    folder.mkdir()
    experiment = folder / "my exp.yaml"
    shutil.copy(REPO / "tune_configs" / "smoke.yaml", experiment)
    output = folder / "my 'run'"
    monkeypatch.setattr(
        runner,
        "run_experiment",
        lambda spec, output, **kw: runner.ExperimentOutcome(
            output, interrupted=True, terminated=False, failed=[], done=0, total=4
        ),
    )
    assert main(["ab", str(experiment), "--output", str(output)]) == 130
    [line] = [line for line in capsys.readouterr().err.splitlines() if "resume with: " in line]
    command = line.split("resume with: ", 1)[1]
    assert shlex.split(command) == ["esper-ray", "ab", str(experiment), "--output", str(output), "--resume"]

    printed = format_outcome(TrainingOutcome([], output / "checkpoints" / "round_00001", output, True, 1.0))
    command = printed.split("(resume: ", 1)[1].split(")\n", 1)[0]
    assert shlex.split(command) == ["esper-ray", "train", "--resume", str(output), "--rounds", "N"]
    tensorboard = printed.split("TensorBoard: ", 1)[1].split(" (", 1)[0]
    assert shlex.split(tensorboard) == ["tensorboard", "--logdir", str(output / "tensorboard")]


class RayWouldStart(Exception):
    """Raised by the stand-in for Ray's start: the command got past every check of its folder."""


def _second_writer_while_ray_starts(monkeypatch, where: str, second: list[str]) -> dict:
    """The first command's Ray start runs `second` (another command on the same folder, started meanwhile) and
    records how it ended; the second command reaching Ray's start too fails the test."""
    seen: dict = {}

    def connect(*args, **kwargs):
        if seen:
            raise AssertionError("a second writer of the run folder went on to start Ray")
        seen["started"] = True
        with pytest.raises(SystemExit) as exit_info:
            main(second)
        seen["code"] = exit_info.value.code
        raise RayWouldStart()

    monkeypatch.setattr(where, connect)
    return seen


def test_a_second_train_on_a_run_folder_is_refused_naming_the_process_that_holds_it(tmp_path, capsys, monkeypatch):
    """Two `train --output same` 1 s apart both ran, one's metrics lost (issue 69, item 3)."""
    out = tmp_path / "run"
    args = ["train", "--task", "digits", "--max-epochs", "2", "--output", str(out)]
    seen = _second_writer_while_ray_starts(monkeypatch, "esper_ray.train.commands.runner.connect_ray", args)
    with pytest.raises(RayWouldStart):
        main(args)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "warning: no seed can be kept" not in line]
    assert seen["code"] == 2 and len(err) == 1, err
    assert f"{out} is in use: process {os.getpid()} is writing a run there" in err[0]


def test_a_second_ab_on_a_run_folder_is_refused_naming_the_process_that_holds_it(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = ["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(out)]
    seen = _second_writer_while_ray_starts(monkeypatch, "esper_ray.experiments.runner.connect_ray", args)
    with pytest.raises(RayWouldStart):
        main(args)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "esper-ray ab: error" in line]
    assert seen["code"] == 2 and len(err) == 1 and f"process {os.getpid()} is writing a run there" in err[0], err
    assert not (out / "tune").exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, monkeypatch):
    """kill -9 leaves run.lock behind, naming a process that no longer runs: the next command takes it over."""
    out = tmp_path / "run"
    holder = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from pathlib import Path; "
            "from esper_ray.train.folders.run_lock import run_folder_lock; "
            "cm = run_folder_lock(Path(sys.argv[1])); cm.__enter__(); print(os.getpid(), flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    dead = int(holder.stdout)
    assert holder.returncode == -signal.SIGKILL and (out / "run.lock").read_text().strip() == str(dead)

    def started(*args, **kwargs):
        assert (out / "run.lock").read_text().strip() == str(os.getpid())  # this command holds it now
        raise RayWouldStart()

    monkeypatch.setattr("esper_ray.train.commands.runner.connect_ray", started)
    with pytest.raises(RayWouldStart):
        main(["train", "--task", "digits", "--max-epochs", "2", "--output", str(out)])


@pytest.mark.parametrize("command", ["train", "ab", "eval --save"])
def test_an_unusable_output_is_refused_in_one_line_before_ray_starts(tmp_path, capsys, monkeypatch, command):
    """--output below a file (or on a read-only file system) was a traceback after Ray started (issue 69, item 6)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command went on to start Ray")

    monkeypatch.setattr("esper_ray.train.commands.runner.connect_ray", refuse)
    monkeypatch.setattr("esper_ray.experiments.runner.connect_ray", refuse)
    (tmp_path / "a file").write_text("not a folder")
    out = tmp_path / "a file" / "run"
    args = {
        "train": ["train", "--task", "digits", "--output", str(out)],
        "ab": ["ab", str(REPO / "tune_configs" / "smoke.yaml"), "--output", str(out)],
        "eval --save": ["eval", "--checkpoint", str(tmp_path / "no run"), "--save", str(out)],
    }[command]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    flag = "--save" if command == "eval --save" else "--output"
    assert exit_info.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert f"{flag} {out}: cannot be written (Not a directory" in err[0], err


def test_the_default_output_is_numbered_past_a_folder_another_command_is_writing(tmp_path):
    """Two `esper-ray train` without --output started together: the second takes train-2 rather than failing."""
    from esper_ray.train.folders.checkpoints import fresh_run_folder
    from esper_ray.train.folders.run_lock import run_folder_lock

    default = tmp_path / "esper_runs" / "train"
    with run_folder_lock(default):  # nothing written yet: Ray is still starting
        assert fresh_run_folder(default, numbered=True) == tmp_path / "esper_runs" / "train-2"
        assert fresh_run_folder(default, numbered=False) == default  # an explicit one: the lock refuses it
    assert fresh_run_folder(default, numbered=True) == default  # its writer gone before it wrote anything


def test_a_folder_a_run_left_before_its_first_checkpoint_is_taken_by_a_new_run(tmp_path, capsys, monkeypatch):
    """kill -9 during start-up left config.json and an empty checkpoints/: `--resume` called the folder empty and a
    new run called it in use, each pointing at the other (issue 74). Nothing is there to continue, and no live
    process holds it: a new run takes it, and --resume says to start one there."""
    out = tmp_path / "run"
    (out / "checkpoints" / "round_00001.partial").mkdir(parents=True)  # a save cut short by the kill
    (out / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text("")
    (out / "run.lock").write_text("999999\n")  # its writer is gone: no flock is held
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--resume", str(out), "--rounds", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert (
        f"the run there saved no checkpoint (it stopped before its first), so there is nothing to continue; start it "
        f"again with --output {out} (without --resume)" in err[0]
    )

    def started(*args, **kwargs):
        raise RayWouldStart()

    monkeypatch.setattr("esper_ray.train.commands.runner.connect_ray", started)
    with pytest.raises(RayWouldStart):  # the run went past every check of its folder
        main(["train", "--task", "digits", "--max-epochs", "2", "--output", str(out)])


def test_a_folder_whose_run_finished_rounds_but_saved_no_checkpoint_is_kept_and_resume_says_where_to_go(
    tmp_path, capsys
):
    """kill -9 at round 3 of a run that checkpoints every 5: its metrics are results, so a new run never writes into
    the folder, and --resume (nothing to continue) points at another --output, not back at the folder."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"rou')  # the last line cut short by the kill
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "digits", "--max-epochs", "2", "--output", str(out)])
    assert exit_info.value.code == 2 and "already holds a run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--resume", str(out), "--rounds", "4"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "start it again with another --output" in err, err
