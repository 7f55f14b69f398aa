"""`mask_cut_off`: no GERMINATE in a slot the loss cannot reach, upstream of a CNN seed blending by ADD or holding.

The premise is checked too, by gradients: a seed planted there gets exactly none (so it could never pass G2 and
be kept), while one planted downstream, or upstream of a MULTIPLY seed, does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_ray.contracts.actions import BlendAlgorithm, Blueprint, Op, Style, encode_joint
from esper_ray.contracts.controllers import FixedSeed
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.slots import forward_position
from esper_ray.contracts.stages import Stage
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.masks import BLENDED_STAGES, head_offsets
from esper_ray.morpho.hosts import build_host
from esper_ray.policy.fixed import FixedSeedController

MAX_EPOCHS = 20  # the r0c1 seed: TRAINING from step 1, blending from 11, HOLDING from 16, fossilized at 17


def episode(mask_cut_off: bool, style: Style = Style.SIGMOID_ADD) -> tuple[list[dict], MorphogeneticEnv]:
    """conv_heavy planted in r0c1 by the fixed controller; per step the r0c1 seed's stage and whether GERMINATE
    was legal in r0c0 (upstream) and r0c2 (downstream). The env is returned as the run left it."""
    env = MorphogeneticEnv(
        {
            "task": "digits-impaired",
            "max_epochs": MAX_EPOCHS,
            "device": "cpu",
            "batch_size": 1024,
            "seed": 3,
            "mask_cut_off": mask_cut_off,
        }
    )
    seed = FixedSeed(Blueprint.CONV_HEAVY, "r0c1", style=style)
    controller = FixedSeedController(env.slot_ids, MAX_EPOCHS, seed, LifecycleConfig().min_training_epochs)
    obs, _ = env.reset(seed=0)
    controller.reset()
    joint = head_offsets()["op_slot"]
    steps = []
    for _ in range(MAX_EPOCHS):
        mask = obs["action_mask"][joint]
        steps.append(
            {
                "stage": env.model.slot("r0c1").stage,
                "r0c0": bool(mask[encode_joint(Op.GERMINATE, 0)]),
                "r0c2": bool(mask[encode_joint(Op.GERMINATE, 2)]),
            }
        )
        obs, _, terminated, _, _ = env.step(controller.act(obs))
        if terminated:
            break
    return steps, env


def test_forward_position_orders_slots_as_the_host_reaches_them():
    """ "Upstream" is the forward pass's order (r0c0, r1c0, r0c1, ...), not the action head's row-major one."""
    host = build_host("digits-impaired")
    reached = []
    host(torch.zeros(2, 1, 8, 8), at_slot=lambda slot, h: reached.append(slot) or h)
    assert sorted(host.slot_ids) == sorted(reached) and "r1c0" in reached
    assert sorted(host.slot_ids, key=forward_position) == reached


def test_germinate_upstream_of_a_seed_blended_by_add_is_masked_only_with_the_setting():
    masked, _ = episode(mask_cut_off=True)
    plain, _ = episode(mask_cut_off=False)
    assert [s["stage"] for s in masked] == [s["stage"] for s in plain]  # the same run: only the mask differs
    blended = [i for i, s in enumerate(plain) if s["stage"] in BLENDED_STAGES]
    assert {plain[i]["stage"] for i in blended} == {Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED}
    for i in blended:
        assert plain[i]["r0c0"] and plain[i]["r0c2"], i  # without the setting both are open
        assert not masked[i]["r0c0"] and masked[i]["r0c2"], i  # with it, only upstream closes
    # before the seed blends the setting changes nothing (GERMINATE waits while a seed trains anyway)
    assert all(masked[i] == plain[i] for i in range(len(plain)) if i not in blended)


def test_a_multiply_seed_passes_the_host_its_gradient_so_upstream_stays_open():
    steps, _ = episode(mask_cut_off=True, style=Style.LINEAR_MULTIPLY)
    blended = [s for s in steps if s["stage"] in BLENDED_STAGES]
    assert blended and all(s["r0c0"] and s["r0c2"] for s in blended)


def seed_gradients(env: MorphogeneticEnv, slot_id: str) -> float:
    """Plant conv_small in `slot_id`, bring it to TRAINING, and return the summed |gradient| of its parameters over
    one batch of digits-impaired-shaped input."""
    slot = env.model.slot(slot_id)
    assert slot.germinate(Blueprint.CONV_SMALL) and slot.advance()
    assert slot.stage is Stage.TRAINING
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    env.model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(env.model(x), y).backward()
    return sum(float(p.grad.abs().sum()) for p in slot.seed_parameters() if p.grad is not None)


@pytest.mark.parametrize(
    ("style", "upstream_gets_gradient"), [(Style.SIGMOID_ADD, False), (Style.LINEAR_MULTIPLY, True)]
)
def test_the_premise_a_seed_upstream_of_an_add_seed_at_alpha_one_gets_no_gradient(style, upstream_gets_gradient):
    _, env = episode(mask_cut_off=False, style=style)
    kept = env.model.slot("r0c1")
    assert kept.stage is Stage.FOSSILIZED and kept.alpha.alpha == 1.0
    assert (seed_gradients(env, "r0c0") > 0) is upstream_gets_gradient
    assert seed_gradients(env, "r0c2") > 0  # downstream the loss reaches a new seed either way


@pytest.mark.parametrize("target", [0.5, 1.0])
def test_a_seed_blending_by_add_toward_any_target_cuts_off_upstream_since_it_is_kept_only_at_one(target):
    """Seen in a run: the policy blended its r0c1 seed toward 0.5, planted r0c0 then, and later raised r0c1 to 1
    to fossilize it (gate G3 keeps seeds at alpha 1 only), which cut r0c0 off: it was still blending at the end."""
    from types import SimpleNamespace

    from esper_ray.env.masks import cut_off

    def slot(slot_id: str, stage: Stage = Stage.DORMANT, algorithm=BlendAlgorithm.ADD, pruning=False):
        return SimpleNamespace(
            slot_id=slot_id,
            stage=stage,
            isolated=True,
            algorithm=algorithm,
            pruning=pruning,
            alpha=SimpleNamespace(target=target),
        )

    for stage in (Stage.BLENDING, Stage.HOLDING):
        below = slot("r0c1", stage)
        slots = [slot("r0c0"), below, slot("r0c2")]
        assert cut_off(slots[0], slots) and not cut_off(slots[2], slots)  # upstream only
        assert not cut_off(slots[0], [slot("r0c0"), slot("r0c1", stage, pruning=True), slot("r0c2")])
        assert not cut_off(
            slots[0], [slot("r0c0"), slot("r0c1", stage, algorithm=BlendAlgorithm.MULTIPLY), slot("r0c2")]
        )
    assert not cut_off(slot("r0c0"), [slot("r0c0"), slot("r0c1", Stage.TRAINING), slot("r0c2")])
