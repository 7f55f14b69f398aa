"""The `fixed` controller: one named seed, germinated at the first step, fossilized at the earliest legal epoch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from esper_ray.contracts.actions import CNN_BLUEPRINTS, Blueprint, Op, Tempo, decode_joint, encode_joint
from esper_ray.contracts.controllers import FixedPlan, FixedSeed
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.masks import head_offsets
from esper_ray.policy.fixed import FixedPlanController, FixedSeedController

LIFECYCLE = LifecycleConfig()
SEED = FixedSeed(Blueprint.CONV_HEAVY, "r0c1")


def run_fixed(auto_forward: bool, max_epochs: int) -> list[dict]:
    """One episode on digits-impaired; per step the mask the controller saw, its action and the env's answer."""
    env = MorphogeneticEnv(
        {
            "task": "digits-impaired",
            "max_epochs": max_epochs,
            "device": "cpu",
            "batch_size": 1024,
            "auto_forward": auto_forward,
            "seed": 3,
        }
    )
    controller = FixedSeedController(env.slot_ids, max_epochs, SEED, LIFECYCLE.min_training_epochs)
    obs, _ = env.reset(seed=0)
    controller.reset()
    joint = head_offsets()["op_slot"]
    steps = []
    for step in range(1, max_epochs + 1):
        action = controller.act(obs)
        mask = obs["action_mask"][joint].copy()
        obs, _, terminated, _, info = env.step(action)
        steps.append({"step": step, "action": action, "mask": mask, "info": info})
        if terminated:
            break
    return steps


@pytest.mark.parametrize(
    ("auto_forward", "fossilize_step"),
    [
        # auto-forward: GERMINATE at step 1 (TRAINING from its tick), 10 epochs of TRAINING (G2 at the tick of step 11),
        # 5 epochs of blend-in ramp (HOLDING at the tick of step 16), FOSSILIZE at step 17
        (True, 1 + LIFECYCLE.min_training_epochs + 5 + 1),
        # no auto-forward: one more step, to ADVANCE out of GERMINATED, and the G3 advance into HOLDING is an action
        # (step 17), so FOSSILIZE comes at step 18
        (False, 1 + 1 + LIFECYCLE.min_training_epochs + 5 + 1),
    ],
)
def test_fixed_controller_fossilizes_its_seed_at_the_earliest_legal_epoch(auto_forward, fossilize_step, monkeypatch):
    # G2's gradient-health test (health >= 0.7) passes when this machine's gradients say so: off here (threshold 0),
    # so the earliest legal epoch is the lifecycle's own, on any machine, and the schedule is what is tested
    lifecycle = EnvConfig.lifecycle.fget
    monkeypatch.setattr(
        EnvConfig, "lifecycle", property(lambda cfg: dataclasses.replace(lifecycle(cfg), min_gradient_health=0.0))
    )
    steps = run_fixed(auto_forward, max_epochs=fossilize_step + 1)
    slot = ["r0c0", "r0c1", "r0c2"].index(SEED.slot)
    ops = [decode_joint(int(s["action"][0])) for s in steps]
    assert ops[0] == (Op.GERMINATE, slot) and Blueprint(int(steps[0]["action"][1])) is Blueprint.CONV_HEAVY
    fossilize = encode_joint(Op.FOSSILIZE, slot)
    first_legal = next(s["step"] for s in steps if s["mask"][fossilize])  # the lifecycle's and the gates' oracle
    assert first_legal == fossilize_step
    assert ops[fossilize_step - 1] == (Op.FOSSILIZE, slot) and steps[fossilize_step - 1]["info"]["action_success"]
    assert steps[-1]["info"]["stages"][SEED.slot] == Stage.FOSSILIZED.name
    assert all(op == (Op.WAIT, None) for op in ops[fossilize_step:])  # then it waits
    assert steps[-1]["info"]["count/fossilized"] == 1 and steps[-1]["info"]["count/refused"] == 0
    # by blueprint: every usable blueprint counted from 0, the planted and kept one once
    by_blueprint = {
        k: v for k, v in steps[-1]["info"].items() if k.startswith(("count/germinated/", "count/fossilized/"))
    }
    assert set(by_blueprint) == {f"count/{o}/{b.key}" for o in ("germinated", "fossilized") for b in CNN_BLUEPRINTS}
    assert {k for k, v in by_blueprint.items() if v} == {"count/germinated/conv_heavy", "count/fossilized/conv_heavy"}
    assert by_blueprint["count/germinated/conv_heavy"] == by_blueprint["count/fossilized/conv_heavy"] == 1
    assert steps[-1]["info"]["seed_params"] == 18 * 4 * 4 + 4 * 4  # conv_heavy at C=4: 18C^2 + 4C (DOMAIN.md)


def test_env_counts_refused_actions_and_the_fixed_controller_retries():
    """Without auto-forward an ADVANCE out of TRAINING before 10 epochs fails G2: the env counts the refusal,
    leaves the seed where it was, and the controller (which reads only the observation) asks again later."""
    env = MorphogeneticEnv(
        {"task": "digits-impaired", "max_epochs": 5, "device": "cpu", "batch_size": 1024, "auto_forward": False}
    )
    obs, _ = env.reset(seed=0)
    controller = FixedSeedController(env.slot_ids, 5, SEED, min_training_epochs=0)  # asks at once: G2 says no
    for _ in range(3):  # GERMINATE, ADVANCE to TRAINING, ADVANCE refused by G2
        obs, _, _, _, info = env.step(controller.act(obs))
    assert info["count/refused"] == 1 and not info["action_success"] and info["stages"]["r0c1"] == Stage.TRAINING.name
    again = controller.act(obs)
    assert decode_joint(int(again[0])) == (Op.ADVANCE, 1)


def test_fixed_seed_settings_name_the_key_and_what_is_allowed():
    slots = ("r0c0", "r0c1")
    assert (
        FixedSeed.from_mapping(
            {"blueprint": "conv_heavy", "slot": "r0c1"}, "arms.f.fixed", topology="cnn", slots=slots
        ).label
        == "conv_heavy@r0c1"
    )
    with pytest.raises(ValueError, match=r"arms.f.fixed.slot='r0c2': not an enabled slot; enabled slots"):
        FixedSeed.from_mapping({"blueprint": "conv_heavy", "slot": "r0c2"}, "arms.f.fixed", topology="cnn", slots=slots)
    with pytest.raises(ValueError, match=r"arms.f.fixed.blueprint: blueprint 'lora' is not available for cnn hosts"):
        FixedSeed.from_mapping({"blueprint": "lora", "slot": "r0c1"}, "arms.f.fixed", topology="cnn", slots=slots)
    with pytest.raises(ValueError, match=r"arms.f.fixed.tempo='quick': choose one of \['fast', 'standard', 'slow'\]"):
        FixedSeed.from_mapping(
            {"blueprint": "norm", "slot": "r0c1", "tempo": "quick"}, "arms.f.fixed", topology="cnn", slots=slots
        )
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['alpha_target'\]"):
        FixedSeed.from_mapping(
            {"blueprint": "norm", "slot": "r0c1", "alpha_target": "half"}, "arms.f.fixed", topology="cnn", slots=slots
        )


def test_a_fixed_plan_is_one_seed_or_a_list_of_seeds_in_slots_of_their_own():
    slots = ("r0c0", "r0c1", "r0c2")
    one = FixedPlan.from_mapping(
        {"blueprint": "conv_heavy", "slot": "r0c1"}, "arms.f.fixed", topology="cnn", slots=slots
    )
    assert one.label == "conv_heavy@r0c1" and one.to_dict() == SEED.to_dict()  # files name one seed as they always did
    pair = FixedPlan.from_mapping(
        [{"blueprint": "conv_heavy", "slot": "r0c1"}, {"blueprint": "bottleneck", "slot": "r0c2"}],
        "arms.f.fixed",
        topology="cnn",
        slots=slots,
    )
    assert pair.label == "conv_heavy@r0c1+bottleneck@r0c2" and [s.slot for s in pair.seeds] == ["r0c1", "r0c2"]
    assert (
        FixedPlan.from_mapping(pair.to_dict(), "fixed", topology="cnn", slots=slots) == pair
    )  # a trial's config round trip
    with pytest.raises(ValueError, match=r"arms.f.fixed=\[\]: name at least one seed"):
        FixedPlan.from_mapping([], "arms.f.fixed", topology="cnn", slots=slots)
    with pytest.raises(ValueError, match=r"arms.f.fixed: slot\(s\) \['r0c1'\] named more than once"):
        FixedPlan.from_mapping(
            [{"blueprint": "norm", "slot": "r0c1"}, {"blueprint": "conv_light", "slot": "r0c1"}],
            "arms.f.fixed",
            topology="cnn",
            slots=slots,
        )
    with pytest.raises(
        ValueError, match=r"arms.f.fixed\[1\].blueprint: blueprint 'lora' is not available for cnn hosts"
    ):
        FixedPlan.from_mapping(
            [{"blueprint": "norm", "slot": "r0c1"}, {"blueprint": "lora", "slot": "r0c2"}],
            "arms.f.fixed",
            topology="cnn",
            slots=slots,
        )


def test_a_fixed_plan_plants_its_second_seed_at_the_first_step_the_env_allows_and_keeps_both():
    """conv_heavy in r0c1, then conv_light in r0c2 in a 30-epoch run: the first at step 1, the second at the first
    step whose mask allows a germination (once the first has left TRAINING), each fossilized when it may be."""
    max_epochs = 30
    env = MorphogeneticEnv(
        {"task": "digits-impaired", "max_epochs": max_epochs, "device": "cpu", "batch_size": 1024, "seed": 3}
    )
    plan = FixedPlan((SEED, FixedSeed(Blueprint.CONV_LIGHT, "r0c2")))
    controller = FixedPlanController(env.slot_ids, max_epochs, plan, LIFECYCLE.min_training_epochs)
    obs, _ = env.reset(seed=0)
    controller.reset()
    joint = head_offsets()["op_slot"]
    germinate_r0c2 = encode_joint(Op.GERMINATE, 2)
    ops, first_allowed, info = [], None, {}
    for step in range(1, max_epochs + 1):
        if first_allowed is None and step > 1 and obs["action_mask"][joint][germinate_r0c2]:
            first_allowed = step  # the env's own answer to "may a seed go in now?"
        action = controller.act(obs)
        ops.append(decode_joint(int(action[0])))
        obs, _, terminated, _, info = env.step(action)
        if terminated:
            break
    assert ops[0] == (Op.GERMINATE, 1)
    germinations = [i + 1 for i, op in enumerate(ops) if op[0] is Op.GERMINATE]
    assert germinations == [1, first_allowed] and first_allowed > 1 + LIFECYCLE.min_training_epochs
    assert [i + 1 for i, op in enumerate(ops) if op[0] is Op.FOSSILIZE and op[1] == 1] == [
        1 + LIFECYCLE.min_training_epochs + 5 + 1
    ]
    assert info["stages"]["r0c1"] == info["stages"]["r0c2"] == Stage.FOSSILIZED.name
    assert info["count/fossilized"] == 2 and info["count/refused"] == 0


class _WaitFirst:
    """WAIT for the first `wait` steps, then the fixed controller: a seed germinated later than step 1."""

    def __init__(self, inner: FixedSeedController, wait: int) -> None:
        self.inner, self.wait, self.step = inner, wait, 0

    def reset(self) -> None:
        self.step = 0

    def act(self, obs):
        self.step += 1
        if self.step <= self.wait:
            action = self.inner.act(obs).copy()
            action[0] = encode_joint(Op.WAIT, None)
            return action
        return self.inner.act(obs)


@pytest.mark.parametrize(("auto_forward", "tempo"), [(True, Tempo.FAST), (False, Tempo.FAST), (True, Tempo.STANDARD)])
def test_commit_horizon_masks_germinate_exactly_when_a_seed_could_no_longer_be_fossilized(auto_forward, tempo):
    """With commit_horizon, a tempo is legal for GERMINATE at step t only if t + commit_steps(tempo) <= max_epochs,
    and GERMINATE itself only while the fastest tempo is. The env's own gates are the oracle that the bound is tight:
    a seed germinated at its tempo's last legal step (2 here) is fossilized at the very last step, so masking later
    steps refuses only seeds that could never be kept."""
    lifecycle = LifecycleConfig(auto_forward=auto_forward)
    max_epochs = lifecycle.commit_steps(tempo) + 2
    last_legal = {t: max_epochs - lifecycle.commit_steps(t) for t in Tempo}
    assert last_legal[tempo] == 2
    seed = FixedSeed(Blueprint.CONV_HEAVY, "r0c1", tempo=tempo)
    germinate = [encode_joint(Op.GERMINATE, i) for i in range(3)]
    offsets = head_offsets()

    def episode(commit_horizon: bool, wait: int, steps: int = max_epochs):
        env = MorphogeneticEnv(
            {
                "task": "digits-impaired",
                "max_epochs": max_epochs,
                "device": "cpu",
                "batch_size": 1024,
                "auto_forward": auto_forward,
                "seed": 3,
                "commit_horizon": commit_horizon,
            }
        )
        controller = _WaitFirst(
            FixedSeedController(env.slot_ids, max_epochs, seed, lifecycle.min_training_epochs), wait
        )
        obs, _ = env.reset(seed=0)
        controller.reset()
        legal, tempos, info = [], [], {}
        for _ in range(steps):
            legal.append(bool(obs["action_mask"][offsets["op_slot"]][germinate].any()))
            tempos.append({t for t in Tempo if obs["action_mask"][offsets["tempo"]][int(t)]})
            obs, _, terminated, _, info = env.step(controller.act(obs))
            if terminated:
                break
        return legal, tempos, info

    # nothing planted: only the horizon can mask GERMINATE or a tempo (two steps past the last legal one suffice)
    legal, tempos, _ = episode(commit_horizon=True, wait=max_epochs, steps=last_legal[Tempo.FAST] + 2)
    steps = range(1, last_legal[Tempo.FAST] + 3)
    assert legal == [step <= last_legal[Tempo.FAST] for step in steps]
    for step, allowed in zip(steps, tempos):
        if step <= last_legal[Tempo.FAST]:
            assert allowed == {t for t in Tempo if step <= last_legal[t]}, step
        else:  # GERMINATE is masked: the tempo head stays open, so that no head is all masked
            assert allowed == set(Tempo), step
    legal, tempos, _ = episode(commit_horizon=False, wait=max_epochs, steps=last_legal[Tempo.FAST] + 2)
    assert all(legal) and all(allowed == set(Tempo) for allowed in tempos)  # without it, the same steps allow all
    # planted at its tempo's last legal step: fossilized by the run's end, so the run keeps it
    _, _, info = episode(commit_horizon=True, wait=last_legal[tempo] - 1)
    assert info["count/germinated"] == 1 and info["count/fossilized"] == 1 and info["count/refused"] == 0
    assert info["stages"]["r0c1"] == Stage.FOSSILIZED.name
    # a step later the controller is refused that tempo, so it plants nothing (GERMINATE may still be legal at FAST)
    _, _, info = episode(commit_horizon=True, wait=last_legal[tempo], steps=last_legal[tempo] + 2)
    assert info["count/germinated"] == 0 and info["count/refused"] == 0


def test_runs_set_up_from_training_settings_have_the_commit_horizon_and_a_bare_env_config_does_not():
    """TrainConfig's env (train, eval, every A/B arm; `esper-ray heuristic` adds the same TRAINING_ENV_DEFAULTS) gets
    commit_horizon on unless its `env` says otherwise; a bare EnvConfig keeps it off. Read through the env the settings
    build: the fast tempo's last legal step is the last step at which such a run's env still allows GERMINATE."""
    max_epochs = LifecycleConfig().commit_steps(Tempo.FAST) + 2
    offsets = head_offsets()
    germinate = [encode_joint(Op.GERMINATE, i) for i in range(3)]

    def germinate_legal_at_the_end(env_config: dict) -> bool:
        env = MorphogeneticEnv({**env_config, "device": "cpu", "batch_size": 1024})
        obs, _ = env.reset(seed=0)
        for _ in range(max_epochs - 1):
            obs, *_ = env.step(np.asarray([encode_joint(Op.WAIT, None)] + [0] * 6))
        return bool(obs["action_mask"][offsets["op_slot"]][germinate].any())

    trained = TrainConfig(task="digits-impaired", max_epochs=max_epochs)
    assert trained.lr == 3e-4
    assert not germinate_legal_at_the_end(trained.env_config())
    assert germinate_legal_at_the_end(
        TrainConfig(task="digits-impaired", max_epochs=max_epochs, env={"commit_horizon": False}).env_config()
    )
    assert germinate_legal_at_the_end({"task": "digits-impaired", "max_epochs": max_epochs})  # EnvConfig's default


@pytest.mark.parametrize("min_training_epochs", [None, "suggested"])
def test_a_12_epoch_run_keeps_nothing_and_with_the_warnings_suggested_setting_plants_and_keeps_its_seed(
    min_training_epochs,
):
    """With the commit horizon (on in every command's runs) a 12-epoch run masks every germination at the default
    min_training_epochs, as its warning says; at the min_training_epochs the warning suggests, the fixed controller
    plants its fast-tempo seed at step 1 and keeps it by the last step."""
    import re

    from esper_ray.contracts.env_config import EnvConfig

    config = {
        "task": "digits-impaired",
        "max_epochs": 12,
        "device": "cpu",
        "batch_size": 1024,
        "seed": 3,
        "commit_horizon": True,
    }
    warning = EnvConfig.from_mapping(config).short_run_warning()
    assert warning is not None
    if min_training_epochs == "suggested":
        config["min_training_epochs"] = int(re.search(r"min_training_epochs <= (\d+)", warning).group(1))
        assert EnvConfig.from_mapping(config).short_run_warning() is None
    env = MorphogeneticEnv(config)
    plan = FixedPlan((FixedSeed(Blueprint.CONV_HEAVY, "r0c1", tempo=Tempo.FAST),))
    controller = FixedPlanController(env.slot_ids, 12, plan, env.cfg.lifecycle.min_training_epochs)
    obs, _ = env.reset(seed=0)
    controller.reset()
    for _ in range(12):
        obs, _, terminated, _, info = env.step(controller.act(obs))
    assert terminated
    if min_training_epochs is None:
        assert info["count/germinated"] == 0 and info["count/fossilized"] == 0
    else:
        assert info["count/germinated"] == 1 and info["count/fossilized"] == 1
        assert info["stages"]["r0c1"] == Stage.FOSSILIZED.name and info["committed_seed_params"] > 0
