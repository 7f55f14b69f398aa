"""TrainConfig holds the EnvConfig of its run: every env setting is declared once (in EnvConfig), the run-level ones
(task, max_epochs, slots, seed, ...) given and recorded at the top level as before, so old records load (no Ray)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from esper_ray.cli import build_parser, train_config_from_args
from esper_ray.cli_args import field_help
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.train_config import RUN_ENV_KEYS, TRAINING_ENV_DEFAULTS, TrainConfig

RECORDS = sorted(Path(__file__).parents[1].glob("docs/results/**/train_config.json"))


def test_train_config_declares_no_env_setting_of_its_own():
    env_fields = {f.name for f in dataclasses.fields(EnvConfig)}
    assert {f.name for f in dataclasses.fields(TrainConfig)} & env_fields == set()
    assert set(RUN_ENV_KEYS) <= env_fields


def test_run_level_settings_given_at_the_top_level_are_the_env_s_own():
    cfg = TrainConfig(task="digits", max_epochs=7, seed=3, slots=["r0c1"], env={"batch_size": 32})
    assert cfg.env == EnvConfig(
        task="digits", max_epochs=7, seed=3, slots=("r0c1",), batch_size=32, **TRAINING_ENV_DEFAULTS
    )
    assert (cfg.task, cfg.max_epochs, cfg.seed, cfg.slots) == ("digits", 7, 3, ("r0c1",))
    assert TrainConfig.from_mapping(cfg.to_dict()) == cfg


def test_a_built_env_takes_the_top_level_settings_over_its_own():
    cfg = TrainConfig(env={"batch_size": 32})
    changed = dataclasses.replace(cfg, max_epochs=9)  # as `train` puts in a plug-in host's slots
    assert changed.env == dataclasses.replace(cfg.env, max_epochs=9) and changed.env.batch_size == 32
    assert TrainConfig(env=EnvConfig(task="digits"), seed=5).env == EnvConfig(task="digits", seed=5)


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: str(p.parent.name))
def test_records_written_before_load_and_are_written_again_unchanged(record):
    stored = json.loads(record.read_text())
    assert TrainConfig.from_record(stored).to_dict() == stored


def test_records_are_found():
    assert len(RECORDS) >= 4  # docs/results/grow_family/controllers/seed*/train_config.json and others


def test_train_help_gives_each_run_level_flag_the_env_setting_s_own_words(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(EnvConfig):
        if f.name in RUN_ENV_KEYS:
            assert "--" + f.name.replace("_", "-") in text and " ".join(field_help(EnvConfig, f).split()) in text, (
                f.name
            )


def _stored_run(tmp_path: Path, env: dict) -> Path:
    """A run folder whose checkpoint's train_config.json is in the format written so far (`env` as it was given)."""
    from esper_ray.train.folders.checkpoints import record_checkpoint
    from esper_ray.train.folders.manifest import write_manifest

    run = tmp_path / "run"
    partial = run / "checkpoints" / "round_00001.partial"
    partial.mkdir(parents=True)
    checkpoint = record_checkpoint(run, TrainConfig(), partial, 1)
    (checkpoint / "train_config.json").write_text(json.dumps({**TrainConfig().to_dict(), "env": env}))
    write_manifest(checkpoint)
    return run


def test_a_resume_given_the_env_settings_the_run_started_with_is_accepted(tmp_path):
    """A run started with `--env commit_horizon=true --env batch_size=32` (its record keeps both, though the first is
    a run's default) continues with the same flags; another env setting is refused, naming env."""
    run = _stored_run(tmp_path, {"commit_horizon": True, "batch_size": 32})
    same = ["train", "--resume", str(run), "--rounds", "3", "--env", "commit_horizon=true", "--env", "batch_size=32"]
    cfg, _ = train_config_from_args(build_parser().parse_args(same))
    assert cfg.rounds == 3 and cfg.env.batch_size == 32 and cfg.env.commit_horizon
    other = ["train", "--resume", str(run), "--rounds", "3", "--env", "batch_size=16"]
    with pytest.raises(ValueError, match=r"and \['env'\] differ from the run's"):
        train_config_from_args(build_parser().parse_args(other))
