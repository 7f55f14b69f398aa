"""`esper-ray grow` (train/commands/grow_command.py): a trained checkpoint's policy grows a built-in or a plug-in host
once, with no RL, and the network is kept as `eval --save` keeps one; what cannot run is refused before the host
trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import esper_ray
from esper_ray.cli import main, shared_name
from esper_ray.contracts.actions import MAX_SLOTS
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.morpho.grown_artifact import ARCHITECTURE_FILE
from esper_ray.train.commands.episodes import EpisodeSummary
from esper_ray.train.commands.evaluate import mean_line
from esper_ray.train.commands.grow_command import TASK_BOUND_ENV_KEYS, default_save_folder, grow_env_config
from tests.episode_summaries import episode_summary

PLUGIN = "tests.plugin_parts"
TOY_HOST = "tests.plugin_parts:ToyMLP"
CHECKPOINT_ENV = {
    "task": "digits-impaired",
    "plugins": [],
    "slots": ["r0c0", "r0c1", "r0c2"],
    "max_epochs": 3,
    "seed": 0,
    "batch_size": 512,
    "host_lr": 0.02,
}
"""The env settings a digits-impaired checkpoint passes on (TrainConfig.env_config), with task-bound ones set."""


def help_of(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["grow", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_grow_help_says_it_grows_one_host_run_without_rl_and_keeps_the_network(capsys):
    text = help_of(capsys)
    for said in (
        "ONE host training run",
        "trains no controller",
        "Unlike `eval`",
        "esper_ray.load_grown(DIR)",
        "package.module:HostClass",
        "--sample",
        "numbered past any that exists",
    ):
        assert said in text, said


# ----------------------------------------------------------------------------------- the run's env settings
def test_a_builtin_host_grows_on_its_own_task_with_the_checkpoints_slots_where_it_has_them():
    config = grow_env_config(CHECKPOINT_ENV, CHECKPOINT_ENV["slots"], "digits", None, [], {}, None)
    assert (config["task"], config["host_preset"], config["slots"]) == ("digits", "digits", ["r0c0", "r0c1", "r0c2"])
    assert not set(TASK_BOUND_ENV_KEYS) & set(config)  # another task: its own batch size and learning rate
    same = grow_env_config(CHECKPOINT_ENV, CHECKPOINT_ENV["slots"], "digits-impaired", None, [], {"max_epochs": 7}, 4)
    assert (same["task"], same["batch_size"], same["max_epochs"], same["seed"]) == ("digits-impaired", 512, 7, 4)
    EnvConfig.from_mapping(config)  # a valid env


def test_a_plugin_host_grows_every_slot_it_declares_on_the_task_it_is_registered_for():
    config = grow_env_config(CHECKPOINT_ENV, CHECKPOINT_ENV["slots"], "toy-mlp", None, [PLUGIN], {}, None)
    assert (config["task"], config["slots"], config["plugins"]) == ("toy-blobs", ["h0", "h1", "h2"], [PLUGIN])
    by_import = grow_env_config(CHECKPOINT_ENV, CHECKPOINT_ENV["slots"], TOY_HOST, "toy-blobs", [PLUGIN], {}, None)
    assert by_import["host_preset"] == TOY_HOST and by_import["slots"] == ["h0", "h1", "h2"]


@pytest.mark.parametrize(
    "host, task, match",
    [
        ("nope", None, r"--host='nope': unknown; choose one of \[.*'digits'.*'toy-mlp'"),
        (TOY_HOST, None, r"--host tests.plugin_parts:ToyMLP: no registered task lists it .*with --task"),
        ("digits", "nope", r"--task: task='nope': unknown; choose one of \[.*'digits-impaired'"),
    ],
)
def test_an_unknown_host_or_task_is_one_line_listing_what_is_registered(host, task, match):
    with pytest.raises(ValueError, match=match) as err:
        grow_env_config(CHECKPOINT_ENV, CHECKPOINT_ENV["slots"], host, task, [PLUGIN], {}, None)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- from a shipped controller (no Ray)
SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "results" / "grow_family" / "controllers" / "seed0"
SHIPPED_ROUND = 60  # tune_configs/grow_family.yaml's rounds


def test_a_shipped_controller_grows_a_host_and_is_evaluated_as_it_is(tmp_path, capsys):
    """docs/results/grow_family/controllers/seedS are checkpoints `grow` and `eval` take with no copy or added file."""
    folder = tmp_path / "net"
    code, out, err = grow(
        capsys, str(SHIPPED), "--host", "digits", "--save", str(folder), "--env", "max_epochs=2", "--env", "device=cpu"
    )
    assert code == 0, err
    assert f"checkpoint {SHIPPED} (round {SHIPPED_ROUND}) grows host digits" in out
    architecture = json.loads((folder / ARCHITECTURE_FILE).read_text())
    assert architecture["run"]["checkpoint"] == "grow_family/controllers/seed0" and architecture["run"]["epochs"] == 2
    assert esper_ray.load_grown(folder)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert main(["eval", "--checkpoint", str(SHIPPED), "--episodes", "1", "--env", "device=cpu"]) == 0
    out = capsys.readouterr().out
    assert f"(round {SHIPPED_ROUND})" in out and out.strip().splitlines()[-1].startswith(
        "mean over 1 episode: test acc "
    )


def episode(index: int, test: float, params_added: int) -> EpisodeSummary:
    return episode_summary(episode=index, test_accuracy=test, params_added=params_added, germinated=1, fossilized=1)


def test_eval_ends_with_the_mean_test_accuracy_and_committed_params_over_its_episodes():
    line = mean_line([episode(0, 0.70, 0), episode(1, 0.80, 600), episode(2, 0.75, 300)])
    assert line == (
        "mean over 3 episodes: test acc 75.00% (min 70.00%, max 80.00%), params kept 300 "
        "(committed network 460 params in all)"
    )


def test_a_shipped_controllers_network_goes_under_the_current_folder_not_beside_the_controller(tmp_path, monkeypatch):
    """A checkpoint that lies in no run folder has no RUN/grown/: the default --save is ./grown/HOST-seedS."""
    monkeypatch.chdir(tmp_path)
    assert default_save_folder(SHIPPED, "digits", 0) == (tmp_path / "grown" / "digits-seed0").resolve()
    assert not (SHIPPED.parents[1] / "grown").exists()


# ----------------------------------------------------------------------------- from a trained checkpoint
@pytest.fixture(scope="module")
def checkpoint(ray_local, tmp_path_factory) -> Path:
    """A 1-round digits-impaired checkpoint (3 slots, 3 epochs an episode)."""
    run = tmp_path_factory.mktemp("grow") / "run"
    assert (
        main(
            [
                "train",
                "--rounds",
                "1",
                "--envs",
                "1",
                "--cpus-per-env",
                "0.5",
                "--max-epochs",
                "3",
                "--episodes-per-env",
                "1",
                "--env",
                "batch_size=512",
                "--output",
                str(run),
            ]
        )
        == 0
    )
    return run / "checkpoints" / "round_00001"


def grow(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["grow", *args])
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.expensive
def test_grow_saves_a_builtin_hosts_network_naming_the_host_and_the_checkpoint(checkpoint, tmp_path, capsys):
    folder = tmp_path / "net"
    code, out, err = grow(capsys, str(checkpoint), "--host", "digits", "--save", str(folder), "--env", "device=cpu")
    assert code == 0, err
    architecture = json.loads((folder / ARCHITECTURE_FILE).read_text())
    assert architecture["host"] == "digits" and architecture["run"]["task"] == "digits"
    assert architecture["run"]["checkpoint"] == shared_name(checkpoint) == "run/checkpoints/round_00001"
    assert (
        shared_name(checkpoint) in architecture["run"]["controller"] and "greedy" in architecture["run"]["controller"]
    )
    assert {p.name for p in folder.iterdir()} == {"weights.pt", ARCHITECTURE_FILE, "summary.md", "accuracy.png"}
    network = esper_ray.load_grown(folder)
    assert network(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert "grow: epoch 3/3: val acc" in out and "seeds planted" in out and "committed" in out
    assert f"grown network: {folder}" in out and f"test acc {100 * architecture['run']['test_accuracy']:.2f}%" in out


@pytest.mark.expensive
def test_without_save_each_network_goes_to_a_new_folder_of_the_run_and_none_is_overwritten(checkpoint, capsys):
    grown = checkpoint.parent.parent / "grown"
    folders = []
    for extra in ([], ["--sample"]):
        code, out, err = grow(capsys, str(checkpoint), "--host", "digits-impaired", "--seed", "3", *extra)
        assert code == 0, err
        [line] = [line for line in out.splitlines() if line.startswith("grown network: ")]
        folders.append(Path(line.split()[2]))
    assert folders == [grown / "digits-impaired-seed3", grown / "digits-impaired-seed3-2"]
    controllers = [json.loads((f / ARCHITECTURE_FILE).read_text())["run"]["controller"] for f in folders]
    assert "greedy" in controllers[0] and "sampled" in controllers[1]
    assert all(json.loads((f / ARCHITECTURE_FILE).read_text())["run"]["seed"] == 3 for f in folders)


@pytest.mark.expensive
def test_grow_saves_a_plugin_host_given_by_its_import_string(checkpoint, tmp_path, capsys):
    folder = tmp_path / "toy"
    code, out, err = grow(
        capsys,
        str(checkpoint),
        "--host",
        TOY_HOST,
        "--task",
        "toy-blobs",
        "--plugins",
        PLUGIN,
        "--save",
        str(folder),
        "--env",
        "device=cpu",
    )
    assert code == 0, err
    architecture = json.loads((folder / ARCHITECTURE_FILE).read_text())
    assert architecture["host"] == TOY_HOST and architecture["topology"] == "vector"
    assert PLUGIN in architecture["plugins"] and architecture["run"]["checkpoint"] == shared_name(checkpoint)
    assert set(architecture["slots"]) == {"h0", "h1", "h2"}
    assert esper_ray.load_grown(folder)(torch.zeros(2, 16)).shape == (2, 4)


@pytest.mark.expensive
def test_what_grow_cannot_run_is_refused_in_one_line_before_the_host_trains(checkpoint, tmp_path, capsys):
    esper_ray.register_host("toy-mlp-17", "tests.plugin_parts:ToyMLP", blocks=17)  # more slots than the policy holds
    new = tmp_path / "new"
    used = tmp_path / "used"
    used.mkdir()
    (used / "mine.txt").write_text("mine")
    for args, said in (
        (["--host", "nope"], "--host='nope': unknown; choose one of ["),
        (
            ["--host", "toy-mlp-17", "--task", "toy-blobs", "--plugins", PLUGIN, "--save", str(new)],
            f"host 'toy-mlp-17' has 17 slots; the policy holds at most MAX_SLOTS={MAX_SLOTS} "
            "(choose fewer with `slots`)",
        ),
        (["--host", "digits", "--save", str(used)], f"--save {used}: already exists and is not an empty folder"),
    ):
        code, out, err = grow(capsys, str(checkpoint), *args)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert "grow: epoch" not in out
    assert not new.exists()  # refused after the folder was checked: it is not left behind
    assert [p.name for p in used.iterdir()] == ["mine.txt"]
    # a policy runs with fewer slots than it was trained with (issue 68 item 3: spaces sized for MAX_SLOTS)
    assert main(["eval", "--checkpoint", str(checkpoint), "--episodes", "1", "--env", "slots=[r0c0, r0c1]"]) == 0


def test_a_host_with_slot_positions_no_training_host_filled_is_said_in_one_line():
    """`grow` and `eval` accepted a 5- or 6-slot host for a policy trained on hosts of at most 4 slots, silently
    (issue 75): the positions past 4 are read by untrained weights. The line names both counts and the untrained
    positions; a host within the trained positions gets none."""
    from esper_ray.contracts.env_config import EnvConfig
    from esper_ray.train.commands.evaluate import untrained_positions_line

    trained = EnvConfig.from_mapping({"family": "digits-family"})  # members of 2 to 4 slots
    assert max(len(cfg.slots) for _, cfg in trained.members()) == 4
    held_out = EnvConfig.from_mapping({"family": "digits-held-out-starved"})
    six = next(cfg for member, cfg in held_out.members() if member.name == "impaired-6b")  # as grow runs it
    line = untrained_positions_line(trained, six)
    assert line is not None and "fills 6 slot positions" in line and "at most 4" in line and "positions 5-6" in line
    assert untrained_positions_line(trained, EnvConfig.from_mapping({"task": "digits"})) is None  # 3 of 4
    assert "fills 6 slot positions" in untrained_positions_line(trained, held_out)  # a family: its largest member
