"""A killed A/B run's PPO trials continue from their last intact checkpoint (experiments/continuation.py):
which checkpoint, the chain a new trial carries, and the rounds its history takes from each set-aside folder.
The whole path on Ray: tests/test_experiments.py, test_ctrl_c_early_and_late_then_a_kill_salvaged_..."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_ray.experiments.continuation import (
    CONTINUES_KEY,
    ROUND_FILE,
    continuation,
    continued_rows,
    newest_intact_checkpoint,
)
from esper_ray.train.folders.manifest import write_manifest


def checkpoint(trial: Path, index: int, round_: int) -> Path:
    """A checkpoint as MorphoTrial.save_checkpoint leaves it: state, round.json, then its manifest."""
    folder = trial / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    (folder / "algorithm_state.pkl").write_bytes(b"state of round %d" % round_)
    (folder / ROUND_FILE).write_text(json.dumps({"round": round_}))
    write_manifest(folder)
    return folder


def results(trial: Path, rounds: list[int]) -> None:
    rows = [
        {"training_iteration": i + 1, "round/round": r, "round/final_accuracy": r / 10} for i, r in enumerate(rounds)
    ]
    (trial / "result.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_newest_checkpoint_that_matches_its_manifest_is_the_one_continued(tmp_path):
    trial = tmp_path / "tune_salvaged_1" / "ppo_seed0_abc_00000"
    intact = checkpoint(trial, 1, 2)
    cut_short = checkpoint(trial, 2, 3)
    (cut_short / "algorithm_state.pkl").write_bytes(b"half")  # the kill came while it was written
    assert newest_intact_checkpoint(trial) == (intact, 2)
    entry = continuation(tmp_path, trial, {})
    assert entry == {
        "links": [{"folder": "tune_salvaged_1/ppo_seed0_abc_00000", "round": 2}],
        "checkpoint": str(intact.resolve()),
    }


def test_checkpoints_without_a_manifest_or_a_round_are_not_continued(tmp_path):
    trial = tmp_path / "tune_salvaged_1" / "ppo_seed0_abc_00000"
    old = trial / "checkpoint_000003"  # code before manifests in trial checkpoints
    old.mkdir(parents=True)
    (old / "algorithm_state.pkl").write_bytes(b"state")
    no_round = checkpoint(trial, 4, 5)
    (no_round / ROUND_FILE).unlink()
    write_manifest(no_round)
    assert newest_intact_checkpoint(trial) is None and continuation(tmp_path, trial, {}) is None


def test_history_of_a_trial_continued_twice_takes_each_round_once_from_where_it_was_trained(tmp_path):
    """Killed at round 3 with its checkpoint at 2, continued and killed at 5 with its checkpoint at 4: the new
    trial's history is rounds 1-2 from the first folder, 3-4 from the second, then its own."""
    first = tmp_path / "tune_salvaged_1" / "ppo_seed0_abc_00000"
    first.mkdir(parents=True)
    results(first, [1, 2, 3])  # round 3 reported, not checkpointed: trained again after the continuation
    checkpoint(first, 1, 2)
    once = continuation(tmp_path, first, {})
    second = tmp_path / "tune_salvaged_2" / "ppo_seed0_def_00000"
    second.mkdir(parents=True)
    results(second, [3, 4, 5])
    checkpoint(second, 1, 4)
    twice = continuation(tmp_path, second, {CONTINUES_KEY: once})
    assert [link["round"] for link in twice["links"]] == [2, 4]
    assert [row["round/round"] for row in continued_rows(tmp_path, {CONTINUES_KEY: twice})] == [1, 2, 3, 4]
    assert continued_rows(tmp_path, {}) == []


@pytest.mark.parametrize(
    "entry, expected",
    [
        ({"links": [{"folder": "../elsewhere", "round": 2}]}, "outside the run"),
        ({"links": [{"folder": "tune_salvaged_1/x"}]}, "not the chain"),
        ("checkpoint", "not the chain"),
    ],
)
def test_a_chain_that_is_not_what_salvage_writes_is_refused(tmp_path, entry, expected):
    with pytest.raises(ValueError, match=expected):
        continued_rows(tmp_path, {CONTINUES_KEY: entry})


def test_a_salvaged_trial_whose_last_round_is_checkpointed_is_evaluated_not_trained(tmp_path, monkeypatch):
    """Killed between its last round's checkpoint and its evaluation's result: continued, it trains no round past
    the file's `rounds` (issue 69, item 2) and reports the checkpoint's round summary with its evaluation."""
    from types import SimpleNamespace

    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.experiments import trainable
    from esper_ray.experiments.trial_keys import EVAL_PREFIX, SUMMARY_PREFIX

    last = checkpoint(tmp_path / "tune_salvaged_1" / "ppo_seed1_abc_00000", 1, 3)
    (last / ROUND_FILE).write_text(json.dumps({"round": 3, "summary": {SUMMARY_PREFIX + "round": 3, "other": 1}}))
    write_manifest(last)
    algo = SimpleNamespace(iteration=0)
    trained = []
    monkeypatch.setattr(trainable, "restore", lambda a, path: setattr(a, "iteration", 3))
    monkeypatch.setattr(
        trainable, "train_round", lambda a: trained.append(a) or setattr(a, "iteration", a.iteration + 1)
    )
    monkeypatch.setattr(trainable, "evaluate_on_env_runners", lambda *args: [])
    monkeypatch.setattr(trainable, "evaluation_metrics", lambda summaries: {EVAL_PREFIX + "test_accuracy": 0.5})
    trial = object.__new__(trainable.MorphoTrial)
    trial.algo, trial.cfg, trial.continue_from, trial.round_summary = algo, TrainConfig(rounds=3), str(last), {}
    trial.eval_episodes, trial.save_networks, trial.label, trial.setup_report = 1, False, "ppo/seed1", {}
    trial.held_out = []  # no held-out hosts: the evaluation on the trial's own settings
    metrics = trial.step()
    assert not trained and algo.iteration == 3
    assert metrics[EVAL_PREFIX + "test_accuracy"] == 0.5 and metrics["done"] is True
    assert metrics[SUMMARY_PREFIX + "round"] == 3 and "other" not in metrics  # the history keeps round 3, once
