"""The report's training rollouts by block: block means over trials, and the rule that says where a curve is level."""

from __future__ import annotations

import numpy as np
import pytest

from esper_ray.contracts.controllers import ControllerKind
from esper_ray.experiments.results import FINISHED, INCOMPLETE, ExperimentRecord, TrialResult
from esper_ray.experiments.rollout_blocks import block_lines, block_size, level_from, rollout_blocks
from esper_ray.experiments.spec import ExperimentSpec


def trial(seed: int, accuracy: list[float], status: str = FINISHED, arm: str = "ppo") -> TrialResult:
    history = [
        {"round": float(r), "final_accuracy": a, "fossilized": 0.1 * seed, "pruned": float(r % 2)}
        for r, a in enumerate(accuracy, start=1)
    ]
    return TrialResult(arm, seed, seed, ControllerKind.PPO, status, history=history)


def test_a_block_is_the_mean_of_each_trials_mean_over_its_rounds():
    """Two trials of 7 rounds, one stopped at round 4, blocks of 3: the second trial counts only for the blocks
    it reached, and each figure is the mean of per-trial block means (numpy on the same lists)."""
    rng = np.random.default_rng(0)
    full, cut = list(rng.uniform(0.2, 0.6, 7)), list(rng.uniform(0.2, 0.6, 4))
    blocks = rollout_blocks([trial(1, full), trial(2, cut, INCOMPLETE)], rounds=7, size=3)
    assert [(b.first, b.last, b.trials) for b in blocks] == [(1, 3, 2), (4, 6, 2), (7, 7, 1)]
    assert blocks[0].accuracy == pytest.approx(np.mean([np.mean(full[0:3]), np.mean(cut[0:3])]))
    assert blocks[1].accuracy == pytest.approx(np.mean([np.mean(full[3:6]), cut[3]]))
    assert blocks[2].accuracy == pytest.approx(full[6])
    assert blocks[0].fossilized == pytest.approx(0.15)  # trials' 0.1 and 0.2
    assert blocks[0].pruned == pytest.approx(np.mean([1, 0, 1]))  # rounds 1, 2, 3 of both


def test_a_curve_is_level_from_the_first_block_every_later_block_stays_near():
    def blocks_of(accuracies: list[float]):
        return rollout_blocks([trial(0, accuracies)], rounds=len(accuracies), size=1)

    rising_then_flat = blocks_of([0.20, 0.30, 0.40, 0.445, 0.44, 0.448])
    assert level_from(rising_then_flat).first == 4  # 0.40 is 0.048 below the last block
    assert level_from(blocks_of([0.44, 0.44, 0.44])).first == 1
    assert level_from(blocks_of([0.40, 0.44, 0.40, 0.44])) is None  # the last two blocks differ by 0.04
    assert level_from(blocks_of([0.40])) is None


def test_the_report_section_lists_ppo_arms_only_with_their_level():
    spec = ExperimentSpec.from_mapping(
        {
            "name": "t",
            "arms": {"ppo": {}, "none": {"controller": "none"}},
            "seeds": [0, 1],
            "rounds": 40,
            "training": {"task": "digits-impaired"},
        }
    )
    flat = [0.2] * 10 + [0.4] * 30
    record = ExperimentRecord(
        spec, 1, False, [trial(0, flat), trial(1, flat), TrialResult("none", 0, 2, ControllerKind.NONE, FINISHED)]
    )
    text = "\n".join(block_lines(record))
    assert block_size(40) == 10 and block_size(12) == 4
    assert "**ppo**: level from rounds 11-20" in text and "**none**" not in text
    assert "| committed accuracy | 0.200 | 0.400 | 0.400 | 0.400 |" in text and "| trials | 2 | 2 | 2 | 2 |" in text


def test_the_blueprint_planted_most_and_its_share_per_block():
    """Two trials that plant attention ever more often than mlp: per block the blueprint planted most and its share
    of the germinations (means over trials of per-trial means, as the other figures); runs without the record show
    no such row."""

    def planting(seed: int, attention: list[float], mlp: list[float]) -> TrialResult:
        t = trial(seed, [0.4] * len(attention))
        for row, a, b in zip(t.history, attention, mlp):
            row.update(
                {
                    "by_blueprint/germinated_attention": a,
                    "by_blueprint/germinated_mlp": b,
                    "by_blueprint/fossilized_attention": 0.0,
                }
            )
        return t

    trials = [
        planting(0, [0.1, 0.1, 0.9, 0.9], [0.9, 0.9, 0.1, 0.1]),
        planting(1, [0.2, 0.4, 0.6, 1.0], [0.8, 0.6, 0.4, 0.0]),
    ]
    blocks = rollout_blocks(trials, rounds=4, size=2)
    assert blocks[0].planted == pytest.approx({"attention": np.mean([0.1, 0.3]), "mlp": np.mean([0.9, 0.7])})
    assert blocks[0].most_planted() == ("mlp", pytest.approx(0.8))  # 0.8 of 1.0 germination an episode
    assert blocks[1].most_planted() == ("attention", pytest.approx(np.mean([0.9, 0.8])))
    spec = ExperimentSpec.from_mapping(
        {
            "name": "t",
            "arms": {"ppo": {}, "none": {"controller": "none"}},
            "seeds": [0, 1],
            "rounds": 4,
            "training": {"task": "digits-impaired"},
        }
    )
    text = "\n".join(block_lines(ExperimentRecord(spec, 1, False, trials)))
    assert "| most planted (share of germinations) | mlp 0.80 | attention 0.85 |" in text
    assert "most planted" not in "\n".join(block_lines(ExperimentRecord(spec, 1, False, [trial(0, [0.4] * 4)])))
