"""Checkpoints: latest.json only ever names a complete one, and a damaged one is refused at once, naming the
damaged file and the newest complete checkpoint before it, by its manifest, never by loading its pickles (no Ray:
a stand-in algorithm writes the files)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.commands.runner import save_round
from esper_ray.train.folders.checkpoints import (
    LATEST_FILE,
    MANIFEST_FILE,
    in_a_run,
    latest_round,
    resolve_checkpoint,
    round_of,
)

STATE = "learner_group/learner/state.pkl"


class StandInAlgorithm:
    """Saves as RLlib does (pickles in nested folders); `fail_after` files, it stops as a full disk would."""

    def __init__(self, round_: int, fail_after: int | None = None) -> None:
        self.round, self.fail_after = round_, fail_after

    def iteration(self) -> int:
        return self.round

    def save(self, path: Path) -> None:
        files = {
            "algorithm_state.pkl": {"round": self.round},
            STATE: {"weights": list(range(5000))},
            "env_runner/state.pkl": {"filter": [1.0, 2.0]},
        }
        for written, (name, value) in enumerate(files.items()):
            if self.fail_after is not None and written == self.fail_after:
                raise OSError(28, "No space left on device")
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes(pickle.dumps(value))


def run_with_rounds(tmp_path: Path, *rounds: int) -> Path:
    output = tmp_path / "run"
    (output / "checkpoints").mkdir(parents=True)
    for round_ in rounds:
        save_round(StandInAlgorithm(round_), TrainConfig(), output)  # type: ignore[arg-type]
    return output


def test_a_save_cut_short_leaves_latest_on_the_last_complete_checkpoint(tmp_path):
    output = run_with_rounds(tmp_path, 1)
    with pytest.raises(OSError, match="No space left"):
        save_round(StandInAlgorithm(2, fail_after=2), TrainConfig(), output)  # type: ignore[arg-type]
    assert latest_round(output) == 1 and resolve_checkpoint(output).name == "round_00001"
    assert not (output / "checkpoints" / "round_00002").exists()  # only round_00002.partial, which nothing names
    assert json.loads((output / "checkpoints" / LATEST_FILE).read_text()) == {"round": 1, "path": "round_00001"}
    save_round(StandInAlgorithm(2), TrainConfig(), output)  # type: ignore[arg-type]  # the next save starts afresh
    assert resolve_checkpoint(output).name == "round_00002"
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == [LATEST_FILE, "round_00001", "round_00002"]


def test_latest_is_replaced_by_rename_never_rewritten_in_place(tmp_path, monkeypatch):
    output = run_with_rounds(tmp_path, 1)
    latest = output / "checkpoints" / LATEST_FILE
    renamed: list[tuple[str, str]] = []
    real_replace = __import__("os").replace

    def spy(src, dst):
        renamed.append((Path(src).name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr("esper_ray.train.folders.checkpoints.os.replace", spy)
    before = latest.stat().st_ino
    save_round(StandInAlgorithm(2), TrainConfig(), output)  # type: ignore[arg-type]
    # the manifest inside the partial folder, then the folder, then latest.json
    assert renamed == [
        (MANIFEST_FILE + ".tmp", MANIFEST_FILE),
        ("round_00002.partial", "round_00002"),
        (LATEST_FILE + ".tmp", LATEST_FILE),
    ]
    assert latest.stat().st_ino != before  # a new file took the name: no reader ever saw half of one


def test_a_truncated_file_is_named_with_the_checkpoint_to_resume_from_instead(tmp_path):
    output = run_with_rounds(tmp_path, 1, 2)
    state = output / "checkpoints" / "round_00002" / STATE
    saved = state.stat().st_size
    state.write_bytes(state.read_bytes()[:1000])  # what an interrupted copy leaves
    with pytest.raises(ValueError) as err:
        resolve_checkpoint(output)
    message = str(err.value)
    assert f"{STATE}: 1,000 bytes, saved with {saved:,}" in message and "\n" not in message
    assert f"--resume {output / 'checkpoints' / 'round_00001'}" in message
    assert resolve_checkpoint(output / "checkpoints" / "round_00001").name == "round_00001"


def test_changed_contents_or_a_missing_file_are_damage_and_without_an_earlier_checkpoint_it_says_so(tmp_path):
    output = run_with_rounds(tmp_path, 1)
    state = output / "checkpoints" / "round_00001" / STATE
    data = bytearray(state.read_bytes())
    data[100] ^= 0xFF  # same size, one byte flipped
    state.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{STATE}: its contents changed.*no earlier complete checkpoint is in"):
        resolve_checkpoint(output)
    state.unlink()
    with pytest.raises(ValueError, match=rf"{STATE}: missing"):
        resolve_checkpoint(output)


class Marker:
    """A crafted pickle: unpickling it creates the file `path` (what a hostile checkpoint would do instead)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_checkpoint_without_a_manifest_is_refused_without_running_its_pickles(tmp_path):
    output = run_with_rounds(tmp_path, 1, 2)
    checkpoint = output / "checkpoints" / "round_00002"
    marker = tmp_path / "ran"
    (checkpoint / "algorithm_state.pkl").write_bytes(pickle.dumps(Marker(marker)))
    (checkpoint / MANIFEST_FILE).unlink()
    with pytest.raises(ValueError) as err:
        resolve_checkpoint(output)
    message = str(err.value)
    assert f"{MANIFEST_FILE}: missing" in message and "\n" not in message
    assert f"--resume {output / 'checkpoints' / 'round_00001'}" in message
    assert not marker.exists()


def test_a_file_added_to_a_checkpoint_after_its_manifest_is_damage(tmp_path):
    output = run_with_rounds(tmp_path, 1)
    (output / "checkpoints" / "round_00001" / "extra.pkl").write_bytes(pickle.dumps(Marker(tmp_path / "ran")))
    with pytest.raises(ValueError, match=rf"extra.pkl: not in {MANIFEST_FILE}"):
        resolve_checkpoint(output)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("garbage", "not valid JSON"),
        ("", "not valid JSON"),
        ('["round_00002"]', "expected {\"round\": N"),
        ('{"round": "2", "path": "round_00002"}', "expected {\"round\": N"),
        ('{"round": 2}', "expected {\"round\": N"),
    ],
)
def test_a_damaged_latest_json_is_one_line_naming_it_and_the_checkpoint_to_resume(tmp_path, text, expected):
    output = run_with_rounds(tmp_path, 1, 2)
    latest = output / "checkpoints" / LATEST_FILE
    latest.write_text(text)
    with pytest.raises(ValueError) as err:
        resolve_checkpoint(output)
    message = str(err.value)
    assert message.startswith(f"{latest}: ") and expected in message and "\n" not in message
    assert f"--resume {output / 'checkpoints' / 'round_00002'}" in message


def test_latest_naming_an_empty_round_says_the_round_before_is_complete(tmp_path):
    output = run_with_rounds(tmp_path, 1, 2)
    newest = output / "checkpoints" / "round_00002"
    for path in sorted(newest.rglob("*"), reverse=True):  # an interrupted copy: the folder, nothing in it
        path.rmdir() if path.is_dir() else path.unlink()
    with pytest.raises(FileNotFoundError) as err:
        resolve_checkpoint(output)
    message = str(err.value)
    assert "names round 2" in message and f"--resume {output / 'checkpoints' / 'round_00001'}" in message


@pytest.mark.parametrize(
    "text, expected",
    [("{", "not valid JSON"), ("[1, 2]", "expected a mapping"), ('{"rounds": "many"}', "rounds='many'")],
)
def test_damaged_settings_of_a_checkpoint_are_one_line_naming_the_file(tmp_path, text, expected):
    from esper_ray.train.folders.checkpoints import TRAIN_CONFIG_FILE, load_checkpoint_config

    output = run_with_rounds(tmp_path, 1)
    settings = output / "checkpoints" / "round_00001" / TRAIN_CONFIG_FILE
    settings.write_text(text)
    with pytest.raises(ValueError) as err:
        load_checkpoint_config(settings.parent)
    assert str(err.value).startswith(f"{settings}: ") and expected in str(err.value) and "\n" not in str(err.value)


def test_eval_of_a_checkpoint_with_a_crafted_pickle_and_no_manifest_runs_none_of_it(tmp_path, capsys):
    from esper_ray.cli import main

    output = run_with_rounds(tmp_path, 1)
    checkpoint = output / "checkpoints" / "round_00001"
    (checkpoint / "algorithm_state.pkl").write_bytes(pickle.dumps(Marker(tmp_path / "ran")))
    (checkpoint / MANIFEST_FILE).unlink()
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", str(output)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"{MANIFEST_FILE}: missing" in err and "Traceback" not in err
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("named", ["relative", "absolute"])
def test_a_resume_never_writes_outside_the_folder_it_was_given(tmp_path, capsys, monkeypatch, named):
    """latest.json naming another run's checkpoint (through `..` or an absolute path) would make `train --resume w`
    continue that run in its folder (issue 69, item 4): refused in one line before anything runs."""
    from esper_ray.cli import main

    target = run_with_rounds(tmp_path / "t1", 3) / "checkpoints" / "round_00003"
    resumed = run_with_rounds(tmp_path / "w", 2)
    path = str(target) if named == "absolute" else "../../../t1/run/checkpoints/round_00003"
    (resumed / "checkpoints" / LATEST_FILE).write_text(json.dumps({"round": 3, "path": path}))
    assert (resumed / "checkpoints" / path).resolve() == target.resolve()

    def refuse(cfg, output, **kwargs):
        raise AssertionError(f"train went on to write into {output}")

    monkeypatch.setattr("esper_ray.train.commands.runner.run_training", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--resume", str(resumed), "--rounds", "4"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and f"path={path!r} lies outside" in err and len(err.splitlines()) == 1, err


def test_eval_says_once_which_checkpoint_it_loaded_a_training_folder_standing_for_its_newest(
    tmp_path, capsys, monkeypatch
):
    from esper_ray.cli import main

    output = run_with_rounds(tmp_path, 1, 2)
    loaded = []
    monkeypatch.setattr(
        "esper_ray.train.commands.evaluate.run_evaluation",
        lambda checkpoint, *args, **kwargs: loaded.append(checkpoint) or [],
    )
    assert main(["eval", "--checkpoint", str(output)]) == 0
    newest = output / "checkpoints" / "round_00002"
    assert loaded == [newest]
    out = capsys.readouterr().out
    assert out.count("esper-ray eval: checkpoint") == 1 and f"esper-ray eval: checkpoint {newest} (round 2)\n" in out
    assert main(["eval", "--checkpoint", str(output / "checkpoints" / "round_00001"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [] and "checkpoint" not in out  # stdout stays one JSON document
    assert f"esper-ray eval: checkpoint {output / 'checkpoints' / 'round_00001'} (round 1)" in err


def test_a_checkpoint_on_its_own_takes_its_round_from_round_json_as_an_ab_trials_does(tmp_path):
    """A shipped controller (docs/results/grow_family/controllers/seedS) is an A/B trial's checkpoint under any name:
    its round is the one its round.json records; a folder with neither that name nor the file is refused."""
    shipped = tmp_path / "seed3"
    shipped.mkdir()
    (shipped / "round.json").write_text(json.dumps({"round": 120, "summary": {}}))
    assert round_of(shipped) == 120 and not in_a_run(shipped)
    assert round_of(tmp_path / "run" / "checkpoints" / "round_00007") == 7
    assert in_a_run(tmp_path / "run" / "checkpoints" / "round_00007")
    with pytest.raises(ValueError, match=r"other: not an esper-ray checkpoint folder .*round.json"):
        round_of(tmp_path / "other")


def test_a_checkpoint_pickled_before_the_rllib_move_still_loads_its_classes():
    """Checkpoints name the PPO config's classes by module path; those were esper_ray.train.X before train/rllib/."""
    import pickle

    from esper_ray.train.rllib.env_runner import CpuPolicyEnvRunner
    from esper_ray.train.rllib.learner import MorphoPPOLearner

    old = b"cesper_ray.train.learner\nMorphoPPOLearner\n.", b"cesper_ray.train.env_runner\nCpuPolicyEnvRunner\n."
    assert [pickle.loads(p) for p in old] == [MorphoPPOLearner, CpuPolicyEnvRunner]
    assert pickle.dumps(MorphoPPOLearner, protocol=0) == b"cesper_ray.train.rllib.learner\nMorphoPPOLearner\np0\n."
