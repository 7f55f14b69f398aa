"""What `esper-ray --help` and the global flags promise a new user."""

from __future__ import annotations

import os
import re

import pytest

from esper_ray.cli import VERBOSE_ENV, build_parser, main
from esper_ray.contracts.env_config import TASKS


@pytest.mark.parametrize("command", ["train", "heuristic"])
def test_help_of_commands_that_take_a_task_lists_every_task(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: argparse would otherwise break digits-impaired at its hyphen
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    task_help = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("--task TASK"))
    missing = [t for t in TASKS if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", task_help)]
    assert not missing, f"--task help of {command} leaves out {missing}: {task_help}"


@pytest.mark.parametrize("argv, verbose", [
    (["train"], False), (["--verbose", "train"], True), (["train", "--verbose"], True),
    (["--verbose", "train", "--verbose"], True), (["ab", "x.yaml", "--verbose"], True), (["host", "--verbose"], True),
])
def test_verbose_is_accepted_before_or_after_the_command(argv, verbose):
    assert build_parser().parse_args(argv).verbose is verbose


def test_verbose_after_the_command_reaches_ray_startup(monkeypatch, capsys):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    assert main(["host", "--task", "digits", "--verbose"]) == 0
    assert os.environ[VERBOSE_ENV] == "1"
