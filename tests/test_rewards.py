"""Reward modes: signs, hand-worked values, config-time validation."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from esper_ray.contracts.actions import Op
from esper_ray.contracts.rewards import RewardConfig, SlotSignal, StepSignal
from esper_ray.contracts.stages import Stage
from esper_ray.rewards import compute_reward
from esper_ray.rewards.components import potential

REPO = Path(__file__).resolve().parents[1]


def slot(**kw) -> SlotSignal:
    base = dict(
        slot_id="r0c1",
        stage_before=Stage.HOLDING,
        stage_after=Stage.HOLDING,
        epochs_in_stage_before=6,
        epochs_in_stage_after=7,
        age=20,
        contribution=0.03,
        accuracy_at_germination=0.60,
        seed_params=500,
        alpha_before=1.0,
        alpha_after=1.0,
    )
    base.update(kw)
    return SlotSignal(**base)


def signal(**kw) -> StepSignal:
    base = dict(
        epoch=30,
        max_epochs=100,
        op=Op.WAIT,
        target_slot=None,
        action_success=True,
        val_accuracy=0.70,
        prev_val_accuracy=0.69,
        initial_val_accuracy=0.10,
        val_loss=1.0,
        prev_val_loss=1.1,
        random_guess_loss=math.log(10),
        committed_accuracy=0.67,
        host_params=6000,
        slots=(slot(),),
    )
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
    fossilize = signal(
        op=Op.FOSSILIZE, target_slot="r0c1", slots=(slot(stage_after=Stage.FOSSILIZED, epochs_in_stage_after=0),)
    )
    prune = signal(
        op=Op.PRUNE,
        target_slot="r0c1",
        slots=(slot(stage_after=Stage.PRUNED, epochs_in_stage_after=0, alpha_after=0.0),),
    )
    assert compute_reward(fossilize, cfg).total > compute_reward(prune, cfg).total + 1.0


def test_shaped_pruning_a_harmful_seed_beats_fossilizing_it():
    cfg = RewardConfig(mode="shaped")
    harmful = dict(contribution=-0.02)
    fossilize = signal(
        op=Op.FOSSILIZE,
        target_slot="r0c1",
        committed_accuracy=0.72,
        slots=(slot(stage_after=Stage.FOSSILIZED, epochs_in_stage_after=0, **harmful),),
    )
    prune = signal(
        op=Op.PRUNE,
        target_slot="r0c1",
        committed_accuracy=0.72,
        slots=(slot(stage_after=Stage.PRUNED, epochs_in_stage_after=0, alpha_after=0.0, **harmful),),
    )
    assert compute_reward(prune, cfg).total > compute_reward(fossilize, cfg).total


def test_pbrs_matches_a_hand_computation():
    cfg = RewardConfig(mode="simplified", gamma=0.9)
    s = signal(
        slots=(
            slot(
                stage_before=Stage.TRAINING,
                stage_after=Stage.BLENDING,
                epochs_in_stage_before=10,
                epochs_in_stage_after=0,
            ),
        )
    )
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
    last = signal(
        epoch=100,
        val_accuracy=0.70,
        prev_val_accuracy=0.70,
        initial_val_accuracy=0.10,
        committed_accuracy=0.70,
        slots=empty,
    )
    assert compute_reward(last, cfg).components["terminal"] == pytest.approx(5.0 * 0.60)


@pytest.mark.parametrize("mode", ["shaped", "simplified", "basic"])
def test_terminal_rewards_score_the_committed_model_not_the_seeds_on_probation(mode):
    """The run keeps host and fossils (docs/design.md): a seed still holding at the end adds nothing to the terminal
    term."""
    cfg = RewardConfig(mode=mode)
    holding = signal(epoch=100, val_accuracy=0.70, committed_accuracy=0.40)
    committed = signal(epoch=100, val_accuracy=0.40, committed_accuracy=0.40)
    assert compute_reward(holding, cfg).components["terminal"] == pytest.approx(
        compute_reward(committed, cfg).components["terminal"]
    )


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
    pruned = compute_reward(
        signal(op=Op.PRUNE, target_slot="r0c1", slots=(slot(escrow_credit=3.0, stage_after=Stage.PRUNED),)), cfg
    )
    assert pruned.components["escrow_delta"] == pytest.approx(-2.0) and pruned.escrow_credits["r0c1"] == 1.0


@pytest.mark.parametrize("mode", ["simplified", "sparse", "basic", "escrow"])
def test_loss_family_with_a_non_shaped_mode_fails_at_config_time(mode):
    with pytest.raises(
        ValueError, match=f"reward_family='loss' works only with reward_mode='shaped', got reward_mode='{mode}'"
    ):
        RewardConfig(mode=mode, family="loss")


def test_reward_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RewardConfig().gamma = 0.5  # type: ignore[misc]


def test_minimal_is_sparse_plus_a_cost_for_pruning_a_young_seed():
    cfg = RewardConfig(mode="minimal")
    young = compute_reward(
        signal(op=Op.PRUNE, target_slot="r0c1", slots=(slot(age=3, stage_after=Stage.EMBARGOED),)), cfg
    )
    old = compute_reward(
        signal(op=Op.PRUNE, target_slot="r0c1", slots=(slot(age=8, stage_after=Stage.EMBARGOED),)), cfg
    )
    assert young.total == pytest.approx(-0.1) and old.total == 0.0  # not terminal: sparse pays nothing yet
    end = compute_reward(signal(epoch=100), cfg)
    assert end.total == pytest.approx(compute_reward(signal(epoch=100), RewardConfig(mode="sparse")).total)


def test_basic_plus_pays_30_percent_of_the_fossilize_bonus_then_drips_the_rest_for_contribution():
    cfg = RewardConfig(mode="basic_plus")
    fossilizing = signal(
        op=Op.FOSSILIZE, target_slot="r0c1", slots=(slot(stage_after=Stage.FOSSILIZED, contribution=0.03),)
    )
    full_bonus = compute_reward(fossilizing, RewardConfig(mode="basic")).components["fossilize"]
    paid = compute_reward(fossilizing, cfg)
    assert full_bonus > 0 and paid.components["fossilize"] == pytest.approx(0.3 * full_bonus)
    pool = paid.drip_pools["r0c1"]
    assert pool == pytest.approx(0.7 * full_bonus) and paid.components["drip"] == 0.0
    # an epoch later (70 left): drip_scale = pool / 70, times the fossil's contribution in pp (2), clipped at +0.1
    later = signal(
        epoch=30,
        slots=(
            slot(stage_before=Stage.FOSSILIZED, stage_after=Stage.FOSSILIZED, drip_pool=pool, contribution_after=0.02),
        ),
    )
    dripped = compute_reward(later, cfg)
    assert dripped.components["drip"] == pytest.approx(min(pool / 70 * 2.0, 0.1))
    assert dripped.drip_pools["r0c1"] == pytest.approx(pool - pool / 70)
    hurting = compute_reward(
        dataclasses.replace(later, slots=(dataclasses.replace(later.slots[0], contribution_after=-0.5),)), cfg
    )
    assert hurting.components["drip"] == pytest.approx(-0.05)  # a fossil that hurts loses a little, clipped


def test_shaped_pays_a_synergy_bonus_for_positive_pair_interactions():
    cfg = RewardConfig(mode="shaped")
    with_synergy = compute_reward(signal(slots=(slot(interaction_sum=0.02),)), cfg)
    without = compute_reward(signal(slots=(slot(interaction_sum=-0.02),)), cfg)
    assert with_synergy.components["synergy"] == pytest.approx(0.1 * math.tanh(0.5 * 2.0))
    assert without.components["synergy"] == 0.0


# ------------------------------------------------------------------------------------------------ committed
HOST_CURVE = (0.20, 0.24, 0.27, 0.29, 0.30, 0.31, 0.32, 0.33, 0.33, 0.34, 0.34, 0.35, 0.35)


def committed_episode(
    fossilize_at: int | None,
    *,
    host=HOST_CURVE,
    gain: float = 0.10,
    planted_at: int = 1,
    blends_at: int = 3,
    host_params: int = 160,
    seed_params: int = 320,
) -> list[StepSignal]:
    """A constructed run of len(host) steps: the host's own accuracy curve `host`; a seed planted by step
    `planted_at` that adds `gain` from step `blends_at` on (alpha 1), fossilized at step `fossilize_at` or left
    holding. A seed left on probation is dropped at the end: the committed model is the host alone, which has
    lost `gain` from adapting to the seed (committed = host - gain), as digits-impaired's host does."""
    steps, T = [], len(host) - 1
    stage, in_stage, alpha = Stage.DORMANT, 0, 0.0
    for t in range(1, T + 1):
        before_stage, before_in_stage, before_alpha = stage, in_stage, alpha
        op, target = Op.WAIT, None
        if t == planted_at:
            stage, in_stage, op, target = Stage.TRAINING, 0, Op.GERMINATE, "r0c1"
        elif t == blends_at:
            stage, in_stage, alpha = Stage.HOLDING, 0, 1.0
        elif fossilize_at is not None and t == fossilize_at:
            stage, in_stage, op, target = Stage.FOSSILIZED, 0, Op.FOSSILIZE, "r0c1"
        else:
            in_stage += 1
        val = host[t] + (gain if alpha > 0 else 0.0)
        prev = host[t - 1] + (gain if before_alpha > 0 else 0.0)
        committed = val if stage is Stage.FOSSILIZED or alpha == 0 else host[t] - gain
        steps.append(
            signal(
                epoch=t,
                max_epochs=T,
                op=op,
                target_slot=target,
                val_accuracy=val,
                prev_val_accuracy=prev,
                initial_val_accuracy=host[0],
                committed_accuracy=committed,
                host_params=host_params,
                slots=(
                    slot(
                        stage_before=before_stage,
                        stage_after=stage,
                        epochs_in_stage_before=before_in_stage,
                        epochs_in_stage_after=in_stage,
                        alpha_before=before_alpha,
                        alpha_after=alpha,
                        seed_params=seed_params if stage is not Stage.DORMANT else 0,
                        contribution=gain if before_alpha > 0 else None,
                        accuracy_at_germination=host[0],
                    ),
                ),
            )
        )
    return steps


def discounted_return(steps: list[StepSignal], cfg: RewardConfig) -> float:
    return sum(cfg.gamma**t * compute_reward(s, cfg).total for t, s in enumerate(steps))


def test_committed_return_is_the_final_committed_accuracy_less_its_size_cost():
    """Potential differences telescope: the discounted return is gamma^T Phi(s_T) - Phi(s_0), with Phi(s_T) the
    committed model's accuracy (pp) less param_cost_pp * log2(1 + kept seed params / host params), whatever happened
    before."""
    cfg = RewardConfig(mode="committed", gamma=0.99, param_cost_pp=2.0)
    for fossilize_at in (4, None):
        steps = committed_episode(fossilize_at)
        last = steps[-1]
        kept = 320 if fossilize_at is not None else 0
        phi_end = 100 * last.committed_accuracy - 2.0 * math.log2(1 + kept / 160)
        phi_start = 100 * 0.20
        assert discounted_return(steps, cfg) == pytest.approx(cfg.gamma ** len(steps) * phi_end - phi_start)


def test_committed_stage_shaping_sums_to_nothing_over_a_run():
    """The lifecycle shaping is potential-based with the run's end at 0: its discounted sum over a run is
    -Phi(s_0) = 0."""
    cfg = RewardConfig(mode="committed", gamma=0.99, committed_stage_weight=3.0)
    steps = committed_episode(4)
    shaping = sum(cfg.gamma**t * compute_reward(s, cfg).components["stage_shaping"] for t, s in enumerate(steps))
    assert shaping == pytest.approx(0.0, abs=1e-9)
    assert compute_reward(steps[0], cfg).components["stage_shaping"] > 0  # planting pays at once ...
    assert compute_reward(steps[-1], cfg).components["stage_shaping"] < 0  # ... and the end takes it back


@pytest.mark.parametrize("gain", [0.02, 0.10])
def test_the_default_reward_pays_at_least_as_much_for_a_fossilized_contributing_seed_as_for_one_left_on_probation(gain):
    """Issue 30: under `shaped` a FOSSILIZE cost the policy ~135 return (measurements/reward_terms.py). Under the
    default reward, committing a seed that contributes is worth at least as much as leaving it on probation to the
    end."""
    cfg = RewardConfig()
    fossilized = discounted_return(committed_episode(4, gain=gain), cfg)
    probation = discounted_return(committed_episode(None, gain=gain), cfg)
    assert fossilized >= probation + 100 * gain  # at least the seed's contribution, which the end of the run drops
    shaped = RewardConfig(mode="shaped")  # the reward this replaced paid for never committing
    assert discounted_return(committed_episode(4, gain=gain), shaped) < discounted_return(
        committed_episode(None, gain=gain), shaped
    )


def test_committed_end_of_run_takes_back_exactly_what_the_seeds_on_probation_add():
    cfg = RewardConfig(mode="committed", param_cost_pp=0.0)
    last = signal(epoch=100, val_accuracy=0.70, committed_accuracy=0.55)
    assert compute_reward(last, cfg).components["end_of_run"] == pytest.approx(cfg.gamma * 100 * (0.55 - 0.70))
    assert "end_of_run" not in compute_reward(signal(), cfg).components


def test_reward_terms_measurement_runs_and_under_committed_a_fossil_is_worth_more_than_probation(tmp_path):
    """measurements/reward_terms.py (issue 30's "measure first"), at small settings: it prints a table per mode and
    writes its figures. The fixed seed fossilizes at step 17, so 19 epochs leave it two epochs in the run."""
    out = tmp_path / "terms.json"
    run = subprocess.run(
        [
            sys.executable,
            "measurements/reward_terms.py",
            "--episodes",
            "1",
            "--max-epochs",
            "19",
            "--modes",
            "committed",
            "shaped",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "## committed" in run.stdout and "## shaped" in run.stdout
    figures = json.loads(out.read_text())
    assert figures["committed"]["fossilize"]["fossilized"] == 1 and figures["committed"]["probation"]["fossilized"] == 0
    assert figures["committed"]["fossilize"]["discounted total"] > figures["committed"]["probation"]["discounted total"]


def test_blueprint_returns_measurement_pairs_every_plan_with_the_bare_host_on_the_same_episodes(tmp_path):
    """measurements/blueprint_returns.py (issue 30, what each seed is worth on text), at small settings on digits: every
    plan runs the same episodes, on the shard each episode is given, and its table reads gains against the bare host.
    Episodes too short for a lifecycle: a plan that cannot fossilize keeps nothing, and its gain is measured anyway."""
    out = tmp_path / "returns.json"
    run = subprocess.run(
        [
            sys.executable,
            "measurements/blueprint_returns.py",
            "--task",
            "digits-impaired",
            "--max-epochs",
            "2",
            "--episodes",
            "4",
            "--num-shards",
            "2",
            "--epochs",
            "0",
            "1",
            "--slot",
            "r0c1",
            "--workers",
            "1",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    plans = {r["plan"] for r in figures["rows"]}
    assert "none" in plans and "conv_heavy@r0c1 e0" in plans and "attention@r0c1 e1" in plans  # --slot r0c1
    assert "attention@r0c1 e0 probation" in plans and "attention@r0c0 e0" in plans and "attention@r0c2 e0" in plans
    for plan in plans:  # each plan on the same four episodes
        assert sorted(r["episode"] for r in figures["rows"] if r["plan"] == plan) == [1000, 1001, 1002, 1003]
    assert all(r["shard"] == (r["episode"] - 1000) % 2 for r in figures["rows"])
    none = {r["episode"]: r for r in figures["rows"] if r["plan"] == "none"}
    waited = {r["episode"]: r for r in figures["rows"] if r["plan"] == "attention@r0c1 e1"}
    # a plan that waits through epoch 0 (its germination comes too late to change the first epoch) starts as none does
    assert all(waited[e]["curve"][0] == none[e]["curve"][0] for e in none)
    assert "| none | +0.00 |" in run.stdout and "bare host over episodes" in run.stdout
    # the oracle line, recomputed from the rows: each episode's best test accuracy over all plans, averaged
    best_of = {e: max(r["test"] for r in figures["rows"] if r["episode"] == e) for e in none}
    oracle = float(re.search(r"each episode's best plan \(an oracle\): ([0-9.]+)", run.stdout).group(1))
    assert oracle == pytest.approx(sum(best_of.values()) / len(best_of), abs=1e-4)


def test_blueprint_returns_headroom_is_each_episodes_best_plan_against_the_best_plan_for_all():
    """A constructed sweep where the best plan for all episodes (b, 0.5 on average) is not every episode's best:
    a wins episode 2 (0.7), so the oracle averages 0.4, 0.7 and 0.5 (hand-worked: 1.6 / 3)."""
    sys.path.insert(0, str(REPO / "measurements"))
    from blueprint_returns import headroom

    tests = {"none": [0.1, 0.1, 0.1], "a": [0.2, 0.7, 0.3], "b": [0.4, 0.6, 0.5]}
    by_plan = {plan: {e: {"test": t} for e, t in enumerate(values, start=1)} for plan, values in tests.items()}
    best, best_mean, oracle, beaten = headroom(by_plan, [1, 2, 3])
    assert best == "b" and best_mean == pytest.approx(0.5)
    assert oracle == pytest.approx(1.6 / 3) and beaten == 1


def test_blueprint_returns_with_a_first_seed_plants_it_in_every_plan_but_the_bare_host(tmp_path):
    """`--first conv_heavy@r0c1` (a second seed's worth, issue 30): every plan starts with that seed's fixed lifecycle,
    the table has it alone, and the bare host stays bare. Two epochs: the first seed is still in TRAINING, so no
    second one can be planted (one seed in TRAINING at a time) and every plan with it equals it alone."""
    out = tmp_path / "returns.json"
    run = subprocess.run(
        [
            sys.executable,
            "measurements/blueprint_returns.py",
            "--task",
            "digits-impaired",
            "--max-epochs",
            "2",
            "--episodes",
            "2",
            "--epochs",
            "0",
            "--slot",
            "r0c2",
            "--first",
            "conv_heavy@r0c1",
            "--workers",
            "1",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    by_plan: dict[str, list[dict]] = {}
    for r in rows:
        by_plan.setdefault(r["plan"], []).append(r)
    assert "conv_heavy@r0c1 alone" in by_plan and "conv_heavy@r0c1 + norm@r0c2 e0" in by_plan
    assert "conv_heavy@r0c1 + attention@r0c0 e0" in by_plan and not any("+ attention@r0c1" in p for p in by_plan)
    assert all(r["germinated"] == 0 for r in by_plan["none"])
    alone = {r["episode"]: r for r in by_plan["conv_heavy@r0c1 alone"]}
    for plan, plan_rows in by_plan.items():
        if plan != "none":
            assert all(r["germinated"] == 1 and r["curve"] == alone[r["episode"]]["curve"] for r in plan_rows), plan
    bad = subprocess.run(
        [sys.executable, "measurements/blueprint_returns.py", "--slot", "r0c1", "--first", "conv_heavy@r0c1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        bad.returncode == 2
        and "--first conv_heavy@r0c1: must be BLUEPRINT@SLOT in a slot other than --slot r0c1" in bad.stderr
    )
