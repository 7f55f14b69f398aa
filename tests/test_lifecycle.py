"""Seed lifecycle: legal transitions only, gates, prune pipeline, refused actions change nothing."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper_ray.contracts.actions import AlphaCurve, AlphaSpeed, AlphaTarget, Blueprint, Style, Tempo
from esper_ray.contracts.stages import IllegalTransitionError, Stage
from esper_ray.morpho.gates import GateResult
from tests.morpho_helpers import drive_to, give_healthy_gradients, make_model

# The transition table of DOMAIN.md section 1, written out independently of esper_ray.contracts.stages.
DOMAIN_TRANSITIONS = {
    ("DORMANT", "GERMINATED"),
    ("GERMINATED", "TRAINING"),
    ("GERMINATED", "PRUNED"),
    ("TRAINING", "BLENDING"),
    ("TRAINING", "PRUNED"),
    ("BLENDING", "HOLDING"),
    ("BLENDING", "PRUNED"),
    ("HOLDING", "FOSSILIZED"),
    ("HOLDING", "BLENDING"),
    ("HOLDING", "PRUNED"),
    ("PRUNED", "EMBARGOED"),
    ("EMBARGOED", "RESETTING"),
    ("RESETTING", "DORMANT"),
}
DIGITS_SLOTS = ["r0c0", "r0c1", "r0c2", "r1c0", "r1c1"]


def snapshot(model: torch.nn.Module) -> object:
    """Everything a lifecycle action could change: weights, buffers, grad flags and each slot's state."""
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    slots = []
    for s in model.seed_slots():
        slots.append(
            (
                s.stage,
                s.blueprint,
                s.algorithm,
                s.pruning,
                s.embargo_left,
                s.tempo_epochs,
                s.initial_target,
                dataclasses.asdict(s.alpha),
                dataclasses.asdict(s.metrics),
                id(s.optimizer),
                id(s.seed),
                float(s.alpha_value),
            )
        )
    return tensors, flags, slots


def same(a: object, b: object) -> bool:
    (ta, fa, sa), (tb, fb, sb) = a, b  # type: ignore[misc]
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta) and fa == fb and sa == sb


ACTIONS = st.one_of(
    # Ticks and gradient reports are listed several times so that random sequences reach late stages.
    *[st.tuples(st.just("tick"), st.integers(1, 6))] * 5,
    *[st.tuples(st.just("gradients"))] * 2,
    st.tuples(
        st.just("germinate"),
        st.sampled_from([b.key for b in Blueprint] + ["conv_small"] * 6),
        st.sampled_from(list(Style)),
    ),
    st.tuples(st.just("advance")),
    st.tuples(st.just("fossilize")),
    st.tuples(st.just("prune"), st.sampled_from(list(AlphaSpeed))),
    st.tuples(st.just("retarget"), st.sampled_from(list(AlphaTarget)), st.sampled_from(list(AlphaSpeed))),
    st.tuples(st.just("contribution"), st.floats(-0.05, 0.05)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_slots=st.integers(1, len(DIGITS_SLOTS)),
    auto_forward=st.booleans(),
    steps=st.lists(st.tuples(st.integers(0, 4), ACTIONS), min_size=20, max_size=150),
)
def test_random_lifecycle_actions_stay_legal_and_refusals_change_nothing(num_slots, auto_forward, steps):
    model = make_model(DIGITS_SLOTS[:num_slots], auto_forward=auto_forward, min_training_epochs=2, min_prune_age=2)
    slots = model.seed_slots()
    for slot_pick, action in steps:
        slot = slots[slot_pick % num_slots]
        stages_before = [s.stage for s in slots]
        before = snapshot(model)
        refused = False
        try:
            name = action[0]
            if name == "germinate":
                result = slot.germinate(action[1], style=action[2])
            elif name == "advance":
                result = slot.advance()
            elif name == "fossilize":
                result = slot.fossilize()
            elif name == "prune":
                result = slot.prune(action[1], AlphaCurve.COSINE)
            elif name == "retarget":
                result = slot.set_alpha_target(action[1], action[2])
            elif name == "tick":
                result = GateResult("-", True)
                for _ in range(action[1]):
                    stages_tick = [s.stage for s in slots]
                    model.step_epoch()
                    for s, old in zip(slots, stages_tick):
                        assert s.stage is old or (old.name, s.stage.name) in DOMAIN_TRANSITIONS
                stages_before = [s.stage for s in slots]
            elif name == "gradients":
                result = GateResult("-", True)
                if slot.seed is not None:
                    give_healthy_gradients(slot)
            else:
                result = GateResult("-", True)
                if slot.is_live:
                    slot.metrics.record_contribution(action[1])
            refused = not result.passed
        except (IllegalTransitionError, ValueError):
            refused = True
        if refused:
            assert same(before, snapshot(model)), f"refused {action} changed the model"
        for s, old in zip(slots, stages_before):
            if s.stage is not old:
                assert (old.name, s.stage.name) in DOMAIN_TRANSITIONS, f"{s.slot_id}: {old.name} -> {s.stage.name}"
            assert s.stage in Stage
            assert (s.seed is not None) == s.is_live or s.stage is Stage.FOSSILIZED


def test_illegal_transition_names_both_stages_and_the_slot():
    slot = make_model(["r0c1"]).slot("r0c1")
    with pytest.raises(IllegalTransitionError, match=r"slot r0c1: illegal transition DORMANT -> FOSSILIZED"):
        slot.fossilize()
    drive_to(slot, Stage.TRAINING)
    with pytest.raises(IllegalTransitionError, match=r"r0c1.*TRAINING -> GERMINATED"):
        slot.germinate("norm")


def test_unknown_blueprint_raises_and_lists_the_available_ones():
    slot = make_model(["r0c0"]).slot("r0c0")
    with pytest.raises(ValueError, match=r"unknown blueprint 'resnet'.*available: norm, attention, depthwise"):
        slot.germinate("resnet")
    with pytest.raises(ValueError, match=r"'lora' is not available for CNN hosts"):
        slot.germinate(Blueprint.LORA)
    with pytest.raises(ValueError, match="unknown blueprint 'noop'|'noop' is not available"):
        slot.germinate("noop")
    assert slot.stage is Stage.DORMANT and slot.seed is None


@pytest.mark.parametrize(
    "bad, match",
    [
        ("slot1", "bad slot name 'slot1'"),
        ("r2c0", "bad slot name"),
        ("r0c7", "does not exist in this host"),
        ("r1c2", "does not exist"),
    ],
)
def test_bad_slot_name_raises_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        make_model([bad])


def test_asking_for_a_disabled_slot_names_the_enabled_ones():
    with pytest.raises(ValueError, match=r"slot 'r0c2' is not enabled; enabled slots: \['r0c0'\]"):
        make_model(["r0c0"]).slot("r0c2")


def test_g2_permissive_needs_training_epochs_and_measured_healthy_gradients():
    slot = make_model(["r0c1"], auto_forward=False).slot("r0c1")
    slot.germinate("conv_small")
    assert slot.advance()
    for _ in range(9):
        slot.step_epoch()
    result = slot.advance()
    assert not result and any("9 epochs in TRAINING" in f for f in result.failures)
    slot.step_epoch()
    assert not slot.advance() and slot.stage is Stage.TRAINING  # gradients never measured
    slot.record_gradient_norms([20.0, 0.1], host_norm=1.0, host_params=100)  # one exploding parameter
    assert not slot.advance()
    give_healthy_gradients(slot)
    assert slot.advance() and slot.stage is Stage.BLENDING


def test_g3_needs_alpha_settled_at_one_and_retarget_below_one_leaves_holding():
    slot = make_model(["r0c1"], auto_forward=False).slot("r0c1")
    slot.germinate("conv_small", tempo=Tempo.FAST, alpha_target=AlphaTarget.HALF)
    drive_to_blending = [slot.advance()]
    for _ in range(10):
        slot.step_epoch()
    give_healthy_gradients(slot)
    drive_to_blending.append(slot.advance())
    assert all(drive_to_blending) and slot.stage is Stage.BLENDING
    for _ in range(3):
        slot.step_epoch()
    assert slot.alpha.alpha == 0.5 and slot.alpha.holding
    assert not slot.advance()  # target 0.5 can never hold
    assert slot.set_alpha_target(AlphaTarget.FULL, AlphaSpeed.INSTANT)
    assert slot.advance() and slot.stage is Stage.HOLDING
    assert slot.set_alpha_target(AlphaTarget.SEVENTY, AlphaSpeed.FAST)
    assert slot.stage is Stage.BLENDING


def test_strict_fossilize_gate_needs_one_point_of_contribution():
    slot = make_model(["r0c0"], auto_forward=False, gate_mode="strict").slot("r0c0")
    slot.germinate("conv_small")
    slot.advance()
    for _ in range(10):
        slot.step_epoch()
    give_healthy_gradients(slot)
    slot.observe_accuracy(0.5)
    slot.metrics.accuracy_at_stage_start = 0.4
    assert slot.advance()
    for _ in range(10):
        slot.step_epoch()
    assert slot.advance() and slot.stage is Stage.HOLDING
    slot.metrics.record_contribution(0.004)
    result = slot.fossilize()
    assert not result and "contribution 0.0040 < 0.01" in result.failures[0]
    slot.metrics.record_contribution(0.012)
    assert slot.fossilize() and slot.stage is Stage.FOSSILIZED


def test_prune_ramps_alpha_down_then_embargo_then_dormant():
    slot = make_model(["r0c1"], auto_forward=False).slot("r0c1")
    drive_to(slot, Stage.HOLDING)
    assert slot.prune(AlphaSpeed.FAST, AlphaCurve.LINEAR)
    assert slot.stage is Stage.BLENDING and slot.pruning
    assert all(not p.requires_grad for p in slot.seed_parameters())
    alphas = []
    for _ in range(3):
        slot.step_epoch()
        alphas.append(slot.alpha.alpha)
    assert alphas[:2] == pytest.approx([2 / 3, 1 / 3])
    assert slot.stage is Stage.PRUNED and slot.seed is None and slot.optimizer is None
    seen = []
    for _ in range(8):
        slot.step_epoch()
        seen.append(slot.stage)
    assert seen == [Stage.EMBARGOED] * 5 + [Stage.RESETTING, Stage.DORMANT, Stage.DORMANT]


def test_prune_refused_for_a_young_seed_and_fossils_cannot_be_pruned():
    slot = make_model(["r0c0"], auto_forward=False).slot("r0c0")
    slot.germinate("norm")
    result = slot.prune()
    assert not result and "age 0 < min_prune_age 5" in result.failures[0]
    assert slot.prune(force=True) and slot.stage is Stage.PRUNED
    fossil = make_model(["r0c0"], auto_forward=False).slot("r0c0")
    drive_to(fossil, Stage.FOSSILIZED)
    with pytest.raises(IllegalTransitionError, match="FOSSILIZED -> PRUNED"):
        fossil.prune(force=True)


def test_seed_optimizer_is_created_at_germination_kept_across_stages_and_dropped_at_prune():
    model = make_model(["r0c0"], auto_forward=False)
    slot = model.slot("r0c0")
    slot.germinate("conv_light", style=Style.LINEAR_ADD, tempo=Tempo.FAST)
    optimizer = slot.optimizer
    assert optimizer is not None and {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in slot.seed_parameters()
    }
    slot.advance()
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    momentum = {id(p): optimizer.state[p]["momentum_buffer"].clone() for p in slot.seed_parameters()}
    for _ in range(10):
        slot.step_epoch()
    give_healthy_gradients(slot)
    slot.advance()
    for _ in range(3):
        slot.step_epoch()
    slot.advance()
    assert slot.stage is Stage.HOLDING and slot.optimizer is optimizer
    assert all(torch.equal(optimizer.state[p]["momentum_buffer"], momentum[id(p)]) for p in slot.seed_parameters())
    slot.prune(AlphaSpeed.INSTANT)
    assert slot.optimizer is None


def test_auto_forward_moves_one_stage_per_tick_until_holding():
    slot = make_model(["r1c0"], auto_forward=True, min_training_epochs=2).slot("r1c0")
    slot.germinate("conv_small", tempo=Tempo.FAST)
    slot.step_epoch()
    assert slot.stage is Stage.TRAINING
    give_healthy_gradients(slot)
    stages = []
    for _ in range(6):
        slot.step_epoch()
        stages.append(slot.stage)
    assert stages == [Stage.TRAINING, Stage.BLENDING, Stage.BLENDING, Stage.BLENDING, Stage.HOLDING, Stage.HOLDING]


def test_model_copy_keeps_lifecycle_independent():
    model = make_model(["r0c0", "r0c1"], auto_forward=False)
    clone = copy.deepcopy(model)
    model.slot("r0c0").germinate("norm")
    assert clone.slot("r0c0").stage is Stage.DORMANT


# ------------------------------------------------------------------------------- runs too short to keep a seed
def test_a_run_too_short_for_any_seed_to_be_kept_is_warned_in_one_line_naming_the_minimum_epochs():
    """GERMINATE at step 1, min_training_epochs in TRAINING, the fast tempo's 3-epoch blend, one step in HOLDING:
    the soonest FOSSILIZE is at step 15 with the defaults, so a 12-epoch run keeps nothing, whatever decides."""
    from esper_ray.contracts.env_config import EnvConfig
    from esper_ray.contracts.lifecycle import LifecycleConfig
    from esper_ray.contracts.train_config import TrainConfig

    assert LifecycleConfig().min_epochs_to_keep() == 15 and LifecycleConfig().min_epochs_to_keep(Tempo.STANDARD) == 17
    line = EnvConfig(max_epochs=12).short_run_warning()
    assert line is not None and "\n" not in line
    for part in (
        "no seed can be kept in a run of max_epochs=12",
        "fossilized at epoch 15",
        "min_training_epochs=10",
        "3-epoch blend",
        "set max_epochs >= 15 or min_training_epochs <= 7",
    ):
        assert part in line
    assert TrainConfig(max_epochs=12).short_run_warning() == line  # every command's runs: the same line
    assert EnvConfig(max_epochs=15).short_run_warning() is None  # long enough
    assert EnvConfig(max_epochs=12, min_training_epochs=7).short_run_warning() is None  # the line's own suggestion
    assert EnvConfig(max_epochs=3, max_seeds=0).short_run_warning() is None  # asks for no seed at all
    assert "max_epochs >= 16" in EnvConfig(max_epochs=15, auto_forward=False).short_run_warning()  # one step more
    assert "max_epochs >= 15" in EnvConfig(max_epochs=4).short_run_warning()  # no min_training_epochs can make room
    assert "min_training_epochs <=" not in EnvConfig(max_epochs=4).short_run_warning()
    # a plan at the standard tempo (the fixed plans', the search's and the heuristic's) needs two epochs more
    standard = EnvConfig(max_epochs=16).short_run_warning(Tempo.STANDARD)
    assert standard is not None and "no seed at tempo standard" in standard and "max_epochs >= 17" in standard
