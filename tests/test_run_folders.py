"""Run folders as a careful user meets them (issue 69): one writer at a time, an unusable --output refused before
Ray starts, and the commands printed to resume a run work as pasted, whatever the folder is called. No Ray: the
commands stop before it, or the part that would start it is a stand-in."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from esper_ray.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_printed_resume_commands_are_shell_quoted(tmp_path, capsys, monkeypatch):
    """`resume with: esper-ray ab with space/my exp.yaml --output ...` failed as pasted (issue 69, item 7)."""
    from esper_ray.experiments import runner
    from esper_ray.train.runner import TrainingOutcome, format_outcome

    folder = tmp_path / "with space"
    folder.mkdir()
    experiment = folder / "my exp.yaml"
    shutil.copy(REPO / "tune_configs" / "smoke.yaml", experiment)
    output = folder / "my 'run'"
    monkeypatch.setattr(runner, "run_experiment", lambda spec, output, **kw: runner.ExperimentOutcome(
        output, interrupted=True, terminated=False, failed=[], done=0, total=4))
    assert main(["ab", str(experiment), "--output", str(output)]) == 130
    [line] = [line for line in capsys.readouterr().err.splitlines() if "resume with: " in line]
    command = line.split("resume with: ", 1)[1]
    assert shlex.split(command) == ["esper-ray", "ab", str(experiment), "--output", str(output), "--resume"]

    printed = format_outcome(TrainingOutcome([], output / "checkpoints" / "round_00001", output, True, 1.0))
    command = printed.split("(resume: ", 1)[1].split(")\n", 1)[0]
    assert shlex.split(command) == ["esper-ray", "train", "--resume", str(output), "--rounds", "N"]
    tensorboard = printed.split("TensorBoard: ", 1)[1].split(" (", 1)[0]
    assert shlex.split(tensorboard) == ["tensorboard", "--logdir", str(output / "tensorboard")]
