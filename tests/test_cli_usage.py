"""What `esper-ray --help` and the global flags promise a new user."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from esper_ray.cli import VERBOSE_ENV, build_parser, main
from esper_ray.contracts.env_config import DEFAULT_TASK, TASKS, EnvConfig
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.output.viewer_hints import tensorboard_command


@pytest.mark.parametrize("command", ["train", "heuristic", "host"])
def test_help_of_commands_that_take_a_task_lists_every_task(command, capsys, monkeypatch):
    monkeypatch.setenv(
        "COLUMNS", "1000"
    )  # one line per flag: argparse would otherwise break digits-impaired at its hyphen
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    task_help = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("--task "))
    missing = [t for t in TASKS if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", task_help)]
    assert not missing, f"--task help of {command} leaves out {missing}: {task_help}"


@pytest.mark.parametrize(
    "argv, verbose",
    [
        (["train"], False),
        (["--verbose", "train"], True),
        (["train", "--verbose"], True),
        (["--verbose", "train", "--verbose"], True),
        (["ab", "x.yaml", "--verbose"], True),
        (["host", "--verbose"], True),
    ],
)
def test_verbose_is_accepted_before_or_after_the_command(argv, verbose):
    assert build_parser().parse_args(argv).verbose is verbose


def test_verbose_after_the_command_reaches_ray_startup(monkeypatch, capsys):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    assert main(["host", "--task", "digits", "--verbose"]) == 0
    assert os.environ[VERBOSE_ENV] == "1"


def test_commands_that_take_a_task_default_to_the_same_one():
    # `heuristic` builds an EnvConfig from the flags given, `train` a TrainConfig, `host` reads its own flag
    assert build_parser().parse_args(["host"]).task == EnvConfig().task == TrainConfig().task == DEFAULT_TASK


@pytest.mark.parametrize("installed", [True, False])
def test_the_tensorboard_line_says_how_to_install_tensorboard_where_it_is_missing(installed, monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args):
        if name == "tensorboard":
            return object() if installed else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    line = tensorboard_command("esper_runs/train/tensorboard")
    assert line.startswith("tensorboard --logdir esper_runs/train/tensorboard")
    assert ("pip install -e '.[dashboard]'" in line) is not installed
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^dashboard = \[.*"tensorboard".*\]', pyproject, re.MULTILINE)  # the extra installs it


@pytest.mark.parametrize("during", ["yaml", "torch", "esper_ray.morpho.hosts"])
def test_ctrl_c_while_the_command_loads_is_one_line_and_exit_130(during):
    """Ctrl-C in the first seconds (torch imported before main()'s handler) printed a 12-50 line traceback, once
    pybind11's `terminate called` and SIGABRT (issue 69, item 8). The Ctrl-C is sent as the module named `during`
    starts to load: the command line module's own imports, torch's, a command's."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    # the console script's entry, read without tomllib (Python 3.11+; pyproject allows 3.10)
    [entry] = re.findall(r'^esper-ray = "([\w.]+:\w+)"', (repo / "pyproject.toml").read_text(), re.MULTILINE)
    module, function = entry.split(":")
    code = (
        "import importlib, os, signal, sys\n"
        "def hook(event, args, sent=[]):\n"
        f"    if event == 'import' and args[0] == {during!r} and not sent:\n"
        "        sent.append(1)\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.addaudithook(hook)\n"
        "sys.argv = ['esper-ray', 'host']\n"
        f"sys.exit(getattr(importlib.import_module({module!r}), {function!r})())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=repo)
    assert done.returncode == 130 and len(done.stderr.strip().splitlines()) == 1, (done.returncode, done.stderr)
    assert done.stderr.strip().endswith("interrupted") and done.stdout == "", done.stdout


def help_of(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_train_help_lists_every_env_key_with_the_help_heuristic_gives_its_flag(capsys, monkeypatch):
    """The README asks for `--env min_prune_age=...` and the like: train's help says which keys there are, in the
    words of EnvConfig's own docstrings, as heuristic's flags do (one helper, cli_args.field_help)."""
    import dataclasses

    from esper_ray.contracts.train_config import TRAIN_OWNED_ENV_KEYS

    monkeypatch.setenv("COLUMNS", "100000")  # one line per key and per flag
    train, heuristic = help_of("train", capsys), help_of("heuristic", capsys)
    keys = [f.name for f in dataclasses.fields(EnvConfig) if f.name not in TRAIN_OWNED_ENV_KEYS]
    assert {"min_prune_age", "host_preset", "data_dir"} <= set(keys)
    flags = " ".join(heuristic.split())
    for key in keys:
        [line] = [line for line in train.splitlines() if line.startswith(f"  {key}: ")]
        assert line.split(": ", 1)[1] in flags and "--" + key.replace("_", "-") in flags, key  # the flag's own text
    assert "each given as --env KEY=VALUE" in train


def test_every_command_has_a_description_in_its_help(capsys):
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, parser in commands.items():
        assert parser.description, f"`esper-ray {name} --help` has no description"
    assert "injection slots" in help_of("host", capsys)


def test_no_function_of_the_cli_runs_past_60_lines():
    """build_parser was ~150 lines: one function per command now, and the flags commands share from parent parsers."""
    import ast

    import esper_ray.cli

    tree = ast.parse(Path(esper_ray.cli.__file__).read_text())
    long = {
        n.name: n.end_lineno - n.lineno + 1
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 60
    }
    assert not long, long


def test_eval_and_grow_take_seed_and_env_as_one_definition_with_their_own_help():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    flags = {c: {a.dest: a for a in sub[c]._actions if a.dest in ("seed", "env", "threads")} for c in ("eval", "grow")}
    for dest in ("seed", "env", "threads"):
        e, g = flags["eval"][dest], flags["grow"][dest]
        assert (type(e), e.type, e.default, e.metavar, e.option_strings) == (
            type(g),
            g.type,
            g.default,
            g.metavar,
            g.option_strings,
        )
    assert flags["eval"]["seed"].help != flags["grow"]["seed"].help  # each says what its own run does with the seed
