"""The README's commands as a new user runs them: the quick start's `esper-ray train`, then the "Use" block in
order, in a fresh folder, each exiting 0; what they write is ignored by git; the task lists agree with the code.

The commands are read from README.md itself, so the test follows the README. Only their sizes change: fewer
rounds, episodes and epochs, one env runner, and the two experiment files replaced, in the fresh folder, by tiny
ones under the same names (the real controllers.yaml runs for hours)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import esper_ray
from esper_ray.cli import main
from esper_ray.contracts.env_config import HOST_PRESET_CHOICES, TASKS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()

SMALL_RUN = {"--envs": "1", "--cpus-per-env": "0.5", "--max-epochs": "2", "--episodes-per-env": "1", "--rounds": "1"}
"""A new training run: one env runner, 2-epoch host runs, one episode a round, one round."""
SMALL_ENV = ["--env", "batch_size=512"]
SMALL_EPISODES = {"--episodes": "1"}
TINY_TRAINING = {
    "task": "digits-impaired",
    "max_epochs": 2,
    "envs": 1,
    "learners": 0,
    "cpus_per_env": 0.5,
    "driver_cpus": 0.5,
    "learner_cpus": 0.5,
    "env": {"batch_size": 512},
}


def bash_block(heading: str) -> list[str]:
    """The command lines of the first ```bash block under `## heading`."""
    section = README[README.index(f"\n## {heading}\n") :]
    block = section[section.index("```bash\n") + len("```bash\n") :]
    return [line for line in block[: block.index("```")].splitlines() if line.strip()]


def use_table() -> list[str]:
    """The commands of the Use section's table (its first column), in order."""
    section = README[README.index("\n## Use\n") :]
    section = section[: section.index("\n## ", 1)]
    return [m.group(1) for m in re.finditer(r"^\| `(esper-ray [^`]+)` \|", section, flags=re.M)]


def argv_of(line: str) -> list[str]:
    """An `esper-ray ...` command line as its arguments after `esper-ray`, its comment dropped."""
    words = shlex.split(line, comments=True)
    assert words[0] == "esper-ray", line
    return words[1:]


def with_flags(argv: list[str], flags: dict[str, str]) -> list[str]:
    """`argv` with each flag's value replaced, or the flag added where the command did not give it."""
    argv = list(argv)
    for flag, value in flags.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def small(argv: list[str]) -> list[str]:
    """The same command at a size for a test."""
    command = argv[0]
    if command == "train" and "--resume" in argv:
        return with_flags(argv, {"--rounds": "2"})  # the run's own settings; one round more than it has
    if command == "train":
        return with_flags(argv, SMALL_RUN) + SMALL_ENV
    if command == "eval" and "--save" not in argv:
        return with_flags(argv, SMALL_EPISODES)
    if command == "grow":  # a controller the repository keeps: its path from the repository's root
        return [str(REPO / a) if a.startswith("docs/") else a for a in argv] + ["--env", "max_epochs=2"]
    if command == "heuristic":
        return with_flags(argv, {**SMALL_EPISODES, "--max-epochs": "2", "--batch-size": "512"})
    return argv


def write_tiny_experiments(folder: Path) -> None:
    """tune_configs/controllers.yaml and smoke.yaml in `folder`, under the names (and experiment names) of the
    repository's, with two seeds, one round and one 2-epoch evaluation episode; smoke keeps its PPO arm."""
    (folder / "tune_configs").mkdir()
    controllers = {
        "name": "controllers",
        "arms": {"heuristic": {"controller": "heuristic"}, "none": {"controller": "none"}},
        "seeds": [0, 1],
        "rounds": 1,
        "eval_episodes": 1,
        "max_concurrent_trials": 2,
        "training": TINY_TRAINING,
    }
    smoke = yaml.safe_load((REPO / "tune_configs" / "smoke.yaml").read_text())
    smoke.update(eval_episodes=1, training={**smoke["training"], **TINY_TRAINING})
    for name, spec in (("controllers", controllers), ("smoke", smoke)):
        (folder / "tune_configs" / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def test_the_use_block_acts_only_on_what_the_quick_start_or_an_earlier_line_writes():
    assert len(use_table()) >= 8  # the table is read, not skipped
    quick_start = bash_block("Quick start")[0].split("&&")[-1]
    assert argv_of(quick_start) == ["train"]
    written = {"esper_runs/train"}  # the quick start's run folder (TrainConfig's default output)
    for line in use_table():
        argv = argv_of(line)
        reads = [argv[argv.index(flag) + 1] for flag in ("--resume", "--checkpoint") if flag in argv]
        if argv[0] == "report":
            reads.append(argv[1])
        for folder in reads:
            assert folder in written, (
                f"{line!r} reads {folder}, which neither the quick start nor an earlier line writes"
            )
        if "--output" in argv:
            written.add(argv[argv.index("--output") + 1])
        if argv[0] == "ab":
            assert (REPO / argv[1]).is_file(), line
            written.add(f"esper_runs/{yaml.safe_load((REPO / argv[1]).read_text())['name']}")
    evaluated = [argv_of(line) for line in use_table() if argv_of(line)[0] == "eval"]
    assert evaluated and all("esper_runs/train" in argv for argv in evaluated)  # what the quick start trained


def test_the_readme_lists_every_task_and_every_other_host_of_a_task():
    tasks = README[README.index("\nTasks (") :]
    tasks = tasks[: tasks.index("\n\n")]
    named = set(re.findall(r"`([a-z0-9-]+)`", tasks))
    others = {preset for presets in HOST_PRESET_CHOICES.values() for preset in presets}
    assert set(TASKS) | others <= named, (
        f"the README's Tasks paragraph leaves out {sorted(set(TASKS) | others - named)}"
    )


@pytest.mark.expensive
def test_the_readmes_commands_run_in_order_in_a_fresh_folder_and_git_ignores_what_they_write(
    ray_local, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    write_tiny_experiments(tmp_path)
    commands = [bash_block("Quick start")[0].split("&&")[-1]] + use_table()
    for line in commands:
        argv = small(argv_of(line))
        code = main(argv)
        printed = capsys.readouterr()
        assert code == 0, (
            f"`esper-ray {shlex.join(argv)}` (README: {line.strip()}) exited {code}:\n{printed.out}\n{printed.err}"
        )
    # The README's Python example, on the network the Use block saved
    assert 'esper_ray.load_grown("grown/")' in README
    assert not esper_ray.load_grown("grown/").training
    assert json.loads(Path("esper_runs/train/metrics.jsonl").read_text().splitlines()[-1])["round"] == 2  # resumed
    assert (tmp_path / "esper_runs" / "controllers" / "report.md").is_file()
    assert (tmp_path / "esper_runs" / "smoke" / "networks").is_dir()
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("no git here to ask what the repository ignores")
    written = [
        p.relative_to(tmp_path) for p in tmp_path.iterdir() if p.name != "tune_configs"
    ]  # ours, not the README's
    assert written
    for path in written:
        inside = next(f for f in (tmp_path / path).rglob("*") if f.is_file()).relative_to(tmp_path)
        ignored = (
            subprocess.run([git, "-C", str(REPO), "check-ignore", "-q", "--no-index", str(inside)]).returncode == 0
        )
        assert ignored, f"{inside}, written by the README's commands, is not ignored by .gitignore"
