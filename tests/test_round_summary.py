"""A round's summary names the blueprint the policy planted most, and `esper-ray train`'s closing lines say it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from esper_ray.formatting import largest_share
from esper_ray.train.commands.runner import TrainingOutcome, format_outcome
from esper_ray.train.output.round_summary import RoundSummary, planted_most


def summary(by_blueprint: dict[str, float]) -> RoundSummary:
    return RoundSummary(
        round=3,
        env_steps=200,
        env_steps_lifetime=600,
        episodes=8,
        episode_return=5.0,
        final_accuracy=0.4,
        final_accuracy_min=0.3,
        final_accuracy_max=0.5,
        final_accuracy_with_probation=0.42,
        params_added=300.0,
        host_params=160.0,
        germinated=1.25,
        fossilized=0.75,
        pruned=0.5,
        rollbacks=0,
        failed_env_steps=0,
        failed_env_steps_lifetime=0,
        env_step_errors="",
        steps_per_second=10.0,
        seconds=20.0,
        by_blueprint=by_blueprint,
    )


def test_the_blueprint_planted_most_is_read_from_germinations_only():
    s = summary(
        {"germinated_conv_heavy": 1.0, "germinated_norm": 0.25, "fossilized_norm": 5.0, "germinated_mlp": math.nan}
    )
    assert planted_most(s) == ("conv_heavy", pytest.approx(0.8))  # 1.0 of 1.25 germinations an episode; NaN ignored
    assert planted_most(summary({"germinated_norm": 0.0})) is None and planted_most(summary({})) is None
    assert largest_share({"a": 1.0, "b": 3.0}) == ("b", 0.75)


def test_the_closing_lines_of_a_run_say_what_its_last_round_planted(tmp_path: Path):
    outcome = TrainingOutcome(
        rounds=[summary({"germinated_conv_heavy": 1.0, "germinated_norm": 0.25})],
        checkpoint=None,
        output=tmp_path,
        interrupted=False,
        seconds=21.0,
    )
    assert "  last round: planted conv_heavy most (80 % of germinations), 0.8 seeds kept an episode" in format_outcome(
        outcome
    )
    quiet = TrainingOutcome(rounds=[summary({})], checkpoint=None, output=tmp_path, interrupted=False, seconds=21.0)
    assert "planted" not in format_outcome(quiet)  # a run made before seeds were counted by blueprint
    assert format_outcome(outcome).startswith("finished 1 round in 21s")  # not "1 rounds"


def test_the_training_summary_gives_block_means_not_a_first_and_a_last_round():
    """`first round 27.2 %, last round 35.9 %` read as progress where the block means were level (issue 74): the
    summary gives the mean of each block of 10 rounds, computed here independently."""
    import dataclasses

    from esper_ray.train.commands.runner import accuracy_by_block

    accuracies = [0.30, 0.10] * 5 + [0.25, 0.15] * 5 + [0.5, 0.4, 0.3]
    rounds = [dataclasses.replace(summary({}), round=i + 1, final_accuracy=a) for i, a in enumerate(accuracies)]
    line = accuracy_by_block(rounds)
    assert "rounds 1-10 20.0%, rounds 11-20 20.0%, rounds 21-23 40.0%" in line
    assert "first round" not in line
