"""Reward modes: signs, hand-worked values, config-time validation."""

from __future__ import annotations

import dataclasses
import math

import pytest

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import RewardConfig, SlotSignal, StepSignal
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import compute_reward
from esper_ray.rewards.components import potential


def slot(**kw) -> SlotSignal:
    base = dict(slot_id="r0c1", stage_before=Stage.HOLDING, stage_after=Stage.HOLDING, epochs_in_stage_before=6,
                epochs_in_stage_after=7, age=20, contribution=0.03, accuracy_at_germination=0.60, seed_params=500,
                alpha_before=1.0, alpha_after=1.0)
    base.update(kw)
    return SlotSignal(**base)


def signal(**kw) -> StepSignal:
    base = dict(epoch=30, max_epochs=100, op=Op.WAIT, target_slot=None, action_success=True, val_accuracy=0.70,
                prev_val_accuracy=0.69, initial_val_accuracy=0.10, val_loss=1.0, prev_val_loss=1.1,
                random_guess_loss=math.log(10), committed_accuracy=0.67, host_params=6000,
                slots=(slot(),))
    base.update(kw)
    return StepSignal(**base)


def test_loss_family_rewards_a_falling_loss_above_a_rising_one():
    cfg = RewardConfig(mode="shaped", family="loss")
    falling = compute_reward(signal(val_loss=1.00, prev_val_loss=1.05), cfg)
    rising = compute_reward(signal(val_loss=1.05, prev_val_loss=1.00), cfg)
    assert falling.total > rising.total
    assert falling.components["loss_delta"] == pytest.approx(5.0)  # -5 * clip(-0.05 / 0.05)
    assert rising.components["loss_delta"] == pytest.approx(-2.5)  # regressions count half


def test_shaped_fossilizing_a_helpful_seed_beats_pruning_it():
    cfg = RewardConfig(mode="shaped")
    fossilize = signal(op=Op.FOSSILIZE, target_slot="r0c1", slots=(slot(stage_after=Stage.FOSSILIZED, epochs_in_stage_after=0),))
    prune = signal(op=Op.PRUNE, target_slot="r0c1",
                   slots=(slot(stage_after=Stage.PRUNED, epochs_in_stage_after=0, alpha_after=0.0),))
    assert compute_reward(fossilize, cfg).total > compute_reward(prune, cfg).total + 1.0


def test_shaped_pruning_a_harmful_seed_beats_fossilizing_it():
    cfg = RewardConfig(mode="shaped")
    harmful = dict(contribution=-0.02)
    fossilize = signal(op=Op.FOSSILIZE, target_slot="r0c1", committed_accuracy=0.72,
                       slots=(slot(stage_after=Stage.FOSSILIZED, epochs_in_stage_after=0, **harmful),))
    prune = signal(op=Op.PRUNE, target_slot="r0c1", committed_accuracy=0.72,
                   slots=(slot(stage_after=Stage.PRUNED, epochs_in_stage_after=0, alpha_after=0.0, **harmful),))
    assert compute_reward(prune, cfg).total > compute_reward(fossilize, cfg).total


def test_pbrs_matches_a_hand_computation():
    cfg = RewardConfig(mode="simplified", gamma=0.9)
    s = signal(slots=(slot(stage_before=Stage.TRAINING, stage_after=Stage.BLENDING, epochs_in_stage_before=10, epochs_in_stage_after=0),))
    # Phi(TRAINING, 10 epochs) = 2.0 + min(3.0, 2.0) = 4.0 ; Phi(BLENDING, 0) = 3.5
    assert potential(Stage.TRAINING, 10) == 4.0 and potential(Stage.BLENDING, 0) == 3.5
    assert compute_reward(s, cfg).components["pbrs"] == pytest.approx(0.3 * (0.9 * 3.5 - 4.0))


def test_sparse_is_zero_until_the_last_step_then_committed_accuracy_minus_parameter_cost():
    cfg = RewardConfig(mode="sparse")
    assert compute_reward(signal(), cfg).total == 0.0
    fossil = slot(stage_before=Stage.FOSSILIZED, stage_after=Stage.FOSSILIZED, seed_params=50_000)
    last = signal(epoch=100, committed_accuracy=0.8, slots=(fossil,))
    assert compute_reward(last, cfg).total == pytest.approx(0.8 - 0.1 * 50_000 / 500_000)


def test_basic_terminal_pays_the_improvement_since_the_episode_began():
    cfg = RewardConfig(mode="basic")
    empty = (slot(stage_before=Stage.DORMANT, stage_after=Stage.DORMANT, seed_params=0, contribution=None),)
    last = signal(epoch=100, val_accuracy=0.70, prev_val_accuracy=0.70, initial_val_accuracy=0.10, slots=empty)
    assert compute_reward(last, cfg).components["terminal"] == pytest.approx(5.0 * 0.60)


def test_escrow_pays_credit_changes_and_takes_back_unfossilized_credit_at_the_end():
    cfg = RewardConfig(mode="escrow")
    # progress 10 pp, contribution 3 pp -> credit target sqrt(30) = 5.48, reached in steps of at most 2
    credits, paid = [], []
    held = slot()
    for _ in range(3):
        step = compute_reward(signal(slots=(held,)), cfg)
        credits.append(step.escrow_credits["r0c1"])
        paid.append(step.components["escrow_delta"])
        held = slot(escrow_credit=credits[-1])
    assert credits == pytest.approx([2.0, 4.0, math.sqrt(30.0)])
    assert paid == pytest.approx([2.0, 2.0, math.sqrt(30.0) - 4.0])
    assert compute_reward(signal(slots=(held,)), cfg).components["escrow_delta"] == pytest.approx(0.0)
    final = compute_reward(signal(epoch=100, slots=(held,)), cfg)
    assert final.components["escrow_forfeit"] == pytest.approx(-math.sqrt(30.0))
    assert final.escrow_credits["r0c1"] == 0.0
    pruned = compute_reward(signal(op=Op.PRUNE, target_slot="r0c1", slots=(slot(escrow_credit=3.0, stage_after=Stage.PRUNED),)), cfg)
    assert pruned.components["escrow_delta"] == pytest.approx(-2.0) and pruned.escrow_credits["r0c1"] == 1.0


@pytest.mark.parametrize("mode", ["simplified", "sparse", "basic", "escrow"])
def test_loss_family_with_a_non_shaped_mode_fails_at_config_time(mode):
    with pytest.raises(ValueError, match=f"reward_family='loss' works only with reward_mode='shaped', got reward_mode='{mode}'"):
        RewardConfig(mode=mode, family="loss")


def test_reward_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RewardConfig().gamma = 0.5  # type: ignore[misc]


def test_minimal_is_sparse_plus_a_cost_for_pruning_a_young_seed():
    cfg = RewardConfig(mode="minimal")
    young = compute_reward(signal(op=Op.PRUNE, target_slot="r0c1", slots=(slot(age=3, stage_after=Stage.EMBARGOED),)), cfg)
    old = compute_reward(signal(op=Op.PRUNE, target_slot="r0c1", slots=(slot(age=8, stage_after=Stage.EMBARGOED),)), cfg)
    assert young.total == pytest.approx(-0.1) and old.total == 0.0  # not terminal: sparse pays nothing yet
    end = compute_reward(signal(epoch=100), cfg)
    assert end.total == pytest.approx(compute_reward(signal(epoch=100), RewardConfig(mode="sparse")).total)


def test_basic_plus_pays_30_percent_of_the_fossilize_bonus_then_drips_the_rest_for_contribution():
    cfg = RewardConfig(mode="basic_plus")
    fossilizing = signal(op=Op.FOSSILIZE, target_slot="r0c1", slots=(slot(stage_after=Stage.FOSSILIZED, contribution=0.03),))
    full_bonus = compute_reward(fossilizing, RewardConfig(mode="basic")).components["fossilize"]
    paid = compute_reward(fossilizing, cfg)
    assert full_bonus > 0 and paid.components["fossilize"] == pytest.approx(0.3 * full_bonus)
    pool = paid.drip_pools["r0c1"]
    assert pool == pytest.approx(0.7 * full_bonus) and paid.components["drip"] == 0.0
    # an epoch later (70 left): drip_scale = pool / 70, times the fossil's contribution in pp (2), clipped at +0.1
    later = signal(epoch=30, slots=(slot(stage_before=Stage.FOSSILIZED, stage_after=Stage.FOSSILIZED, drip_pool=pool,
                                         contribution_after=0.02),))
    dripped = compute_reward(later, cfg)
    assert dripped.components["drip"] == pytest.approx(min(pool / 70 * 2.0, 0.1))
    assert dripped.drip_pools["r0c1"] == pytest.approx(pool - pool / 70)
    hurting = compute_reward(dataclasses.replace(later, slots=(dataclasses.replace(later.slots[0], contribution_after=-0.5),)), cfg)
    assert hurting.components["drip"] == pytest.approx(-0.05)  # a fossil that hurts loses a little, clipped


def test_shaped_pays_a_synergy_bonus_for_positive_pair_interactions():
    cfg = RewardConfig(mode="shaped")
    with_synergy = compute_reward(signal(slots=(slot(interaction_sum=0.02),)), cfg)
    without = compute_reward(signal(slots=(slot(interaction_sum=-0.02),)), cfg)
    assert with_synergy.components["synergy"] == pytest.approx(0.1 * math.tanh(0.5 * 2.0))
    assert without.components["synergy"] == 0.0
