"""Forward-pass behaviour of seeds: isolation, shapes, identity at birth, blending and the fused pass."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from esper_ray.contracts.actions import CNN_BLUEPRINTS, AlphaCurve, AlphaSpeed, AlphaTarget, Blueprint, Style
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.alpha_schedule import AlphaSchedule, curve_progress
from esper_ray.morpho.blueprints import build_seed
from esper_ray.morpho.counterfactual import build_plan
from esper_ray.morpho.host import HOST_PRESETS, CNNHost
from tests.morpho_helpers import drive_to, make_model, perturbed_for_eval, separate_forward


def images(preset: str, batch: int = 6, seed: int = 1) -> torch.Tensor:
    cfg = HOST_PRESETS[preset]
    return torch.randn(
        batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("slot_id", ["r0c0", "r0c2", "r1c1"])
@pytest.mark.parametrize("blueprint", ["conv_light", "attention", "norm"])
def test_training_seed_leaves_output_and_host_gradients_unchanged_but_learns(slot_id, blueprint):
    seeded = make_model([slot_id], auto_forward=False)
    bare = copy.deepcopy(seeded)
    slot = seeded.slot(slot_id)
    drive_to(slot, Stage.TRAINING, blueprint=blueprint)
    x, y = images("digits"), torch.arange(6) % 10

    out_seeded, out_bare = seeded(x), bare(x)
    assert torch.equal(out_seeded, out_bare)
    torch.nn.functional.cross_entropy(out_seeded, y).backward()
    torch.nn.functional.cross_entropy(out_bare, y).backward()

    for (name, p_seeded), (_, p_bare) in zip(seeded.host.named_parameters(), bare.host.named_parameters()):
        assert torch.equal(p_seeded.grad, p_bare.grad), name
    seed_grad = sum(float(p.grad.abs().sum()) for p in slot.seed_parameters())
    assert seed_grad > 0


def test_every_blueprint_keeps_the_shape_on_every_slot_of_every_preset():
    for preset, cfg in HOST_PRESETS.items():
        host = CNNHost(cfg)
        for slot_id in host.slot_ids:
            shape = host.slot_shape(slot_id)
            for blueprint in CNN_BLUEPRINTS:
                features = torch.randn(2, *shape)
                assert build_seed(blueprint, shape[0])(features).shape == features.shape, (preset, slot_id, blueprint)


@pytest.mark.parametrize("preset", sorted(HOST_PRESETS))
@pytest.mark.parametrize("style", list(Style))
def test_blending_seeds_run_in_the_model_on_every_slot(preset, style):
    model = make_model(CNNHost(HOST_PRESETS[preset]).slot_ids, preset=preset, auto_forward=False)
    for i, slot in enumerate(model.seed_slots()):
        drive_to(slot, Stage.HOLDING, blueprint=CNN_BLUEPRINTS[i % len(CNN_BLUEPRINTS)].key, style=style)
    out = model(images(preset, batch=3))
    assert out.shape == (3, 10) and torch.isfinite(out).all()


@pytest.mark.parametrize("blueprint", ["norm", "conv_small", "bottleneck"])
def test_identity_blueprints_are_exact_identities_at_birth(blueprint):
    x = torch.randn(3, 16, 4, 4)
    assert torch.equal(build_seed(blueprint, 16)(x), x)


def test_attention_starts_near_identity():
    x = torch.randn(3, 16, 4, 4)
    assert torch.allclose(build_seed("attention", 16)(x), x / (1 + math.exp(-3.0)))


def test_multiply_germination_zero_inits_so_blending_is_identity():
    model = make_model(["r0c1"], auto_forward=False)
    bare = copy.deepcopy(model).eval()
    drive_to(model.slot("r0c1"), Stage.HOLDING, blueprint="conv_light", style=Style.LINEAR_MULTIPLY)
    x = images("digits")
    assert torch.allclose(model.eval()(x), bare(x), atol=1e-6)


def test_add_blend_at_alpha_one_outputs_the_seed():
    model = make_model(["r0c1"], auto_forward=False).eval()
    slot = model.slot("r0c1")
    drive_to(slot, Stage.HOLDING, blueprint="conv_light", style=Style.LINEAR_ADD)
    captured = {}
    slot.register_forward_hook(lambda m, args, out: captured.update(h=args[0], out=out))
    model(images("digits"))
    assert torch.allclose(captured["out"], slot.seed(captured["h"]))


@pytest.mark.parametrize("preset", ["digits", "cifar10"])
def test_fused_k_config_forward_equals_k_separate_forwards(preset):
    slots = ["r0c0", "r0c1", "r1c1", "r0c2"]
    model = make_model(slots, preset=preset, auto_forward=False)
    drive_to(model.slot("r0c0"), Stage.BLENDING, blueprint="conv_light", style=Style.LINEAR_ADD)
    drive_to(model.slot("r0c1"), Stage.HOLDING, blueprint="attention", style=Style.GATED_GATE)
    drive_to(model.slot("r1c1"), Stage.FOSSILIZED, blueprint="depthwise", style=Style.LINEAR_MULTIPLY)
    perturbed_for_eval(model)
    x = images(preset, batch=5)
    alphas = torch.rand(7, len(slots), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fused = model.fused_forward(x, alphas)
        for k in range(alphas.shape[0]):
            torch.testing.assert_close(fused[k], separate_forward(model, x, alphas[k]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(fused[0], fused[1])


@pytest.mark.parametrize("style", [Style.LINEAR_ADD, Style.GATED_GATE, Style.LINEAR_MULTIPLY])
def test_the_parting_slots_seed_run_once_blends_each_configuration_as_a_separate_forward(style):
    """The configurations part at r0c1, whose seed runs once and is blended K ways (ADD, GATE and MULTIPLY)."""
    model = make_model(["r0c1"], preset="cifar10", auto_forward=False)
    drive_to(model.slot("r0c1"), Stage.HOLDING, blueprint="conv_heavy", style=style)
    perturbed_for_eval(model)
    x = images("cifar10", batch=5).contiguous(memory_format=torch.channels_last)
    model = model.to(memory_format=torch.channels_last)
    alphas = torch.tensor([[1.0], [0.0], [0.35]])
    with torch.no_grad():
        fused = model.fused_forward(x, alphas)
        for k in range(3):
            torch.testing.assert_close(fused[k], separate_forward(model, x, alphas[k]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(fused[0], fused[1])


def _batch_sizes_seen(model):
    """Batch size of each host block's input and of the head's, as a list filled by the next forward."""
    seen = []
    for name, module in [*((f"block{i}", b) for i, b in enumerate(model.host.blocks)), ("head", model.host.head)]:
        module.register_forward_pre_hook(lambda m, args, name=name: seen.append((name, args[0].shape[0])))
    return seen


def test_fused_forward_runs_what_the_configurations_share_once():
    slots = ["r0c0", "r0c2"]
    model = make_model(slots, preset="cifar10", auto_forward=False)
    drive_to(model.slot("r0c0"), Stage.HOLDING, blueprint="conv_light", style=Style.LINEAR_ADD)
    drive_to(model.slot("r0c2"), Stage.HOLDING, blueprint="attention", style=Style.GATED_GATE)
    perturbed_for_eval(model)
    x = images("cifar10", batch=5)
    alphas = torch.tensor([[0.7, 1.0], [0.7, 0.0], [0.7, 0.4]])  # r0c0 the same in all: they part at r0c2
    seen = _batch_sizes_seen(model)
    for slot_id in slots:  # each seed's input batch, in the order they run
        model.slot(slot_id).seed.register_forward_pre_hook(
            lambda m, args, s=slot_id: seen.append((s, args[0].shape[0]))
        )
    with torch.no_grad():
        fused = model.fused_forward(x, alphas)
        # r0c2's seed runs once on the 5 samples; only its blend, and what follows it, runs for 3 configurations
        assert seen == [("block0", 5), ("r0c0", 5), ("block1", 5), ("block2", 5), ("r0c2", 5), ("head", 15)]
        for k in range(3):
            torch.testing.assert_close(fused[k], separate_forward(model, x, alphas[k]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(fused[0], fused[1])


def test_fused_forward_of_configurations_that_agree_runs_the_model_once():
    model = make_model(["r0c1", "r1c1"], preset="cifar10", auto_forward=False)
    drive_to(model.slot("r0c1"), Stage.FOSSILIZED, blueprint="conv_light")
    model.eval()
    x = images("cifar10", batch=4)
    alphas = torch.tensor([[1.0, 0.3], [1.0, 0.9]])  # r1c1 has no seed: its column is ignored
    seen = _batch_sizes_seen(model)
    with torch.no_grad():
        fused = model.fused_forward(x, alphas)
        assert [size for _, size in seen] == [4, 4, 4, 4]
        assert fused.shape == (2, 4, 10)
        for k in range(2):
            torch.testing.assert_close(fused[k], separate_forward(model, x, alphas[k]), rtol=1e-5, atol=1e-5)


def test_counterfactual_plan_switches_off_each_blending_seed_and_pair_and_keeps_fossils():
    model = make_model(["r0c0", "r0c1", "r0c2", "r1c0"], auto_forward=False)
    drive_to(model.slot("r0c0"), Stage.HOLDING)
    drive_to(model.slot("r0c1"), Stage.FOSSILIZED)
    drive_to(model.slot("r0c2"), Stage.TRAINING)
    plan = build_plan(model)
    assert plan.names == ("main", "off:r0c0") and plan.committed_index == 1
    assert plan.alphas.tolist() == [[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    drive_to(model.slot("r1c0"), Stage.HOLDING)
    plan = build_plan(model)
    assert plan.names == ("main", "off:r0c0", "off:r1c0", "off:r0c0+r1c0", "all_off") and plan.pairs == (
        ("r0c0", "r1c0"),
    )
    assert plan.alphas[plan.committed_index].tolist() == [0.0, 1.0, 0.0, 0.0]
    with_fossils = build_plan(model, ablate_fossils=True)  # basic_plus measures what each fossil still brings
    assert with_fossils.ablated_slots == ("r0c0", "r0c1", "r1c0") and len(with_fossils.pairs) == 3
    assert with_fossils.alphas[with_fossils.committed_index].tolist() == [0.0, 1.0, 0.0, 0.0]  # fossils stay on there


@pytest.mark.parametrize("curve", list(AlphaCurve))
def test_alpha_curves_are_monotone_from_zero_to_one(curve):
    values = [curve_progress(curve, t / 20) for t in range(21)]
    assert values[0] == pytest.approx(0.0, abs=1e-12) and values[-1] == pytest.approx(1.0)
    assert all(b >= a for a, b in zip(values, values[1:]))


def test_alpha_schedule_lands_on_target_and_retargets_only_from_hold():
    schedule = AlphaSchedule()
    schedule.retarget(1.0, 5, AlphaCurve.COSINE)
    with pytest.raises(RuntimeError, match="retarget only from HOLD"):
        schedule.retarget(0.5, 3, AlphaCurve.LINEAR)
    values = []
    for _ in range(5):
        schedule.step()
        values.append(schedule.alpha)
    assert values[-1] == 1.0 and schedule.holding
    assert values[:4] == pytest.approx([0.5 * (1 - math.cos(math.pi * k / 5)) for k in range(1, 5)])


def test_set_alpha_target_instant_and_gradual():
    slot = make_model(["r0c0"], auto_forward=False).slot("r0c0")
    drive_to(slot, Stage.HOLDING)
    slot.set_alpha_target(AlphaTarget.HALF, AlphaSpeed.INSTANT)
    assert slot.alpha.alpha == 0.5 and float(slot.alpha_value) == 0.5 and slot.stage is Stage.BLENDING
    slot.set_alpha_target(AlphaTarget.FULL, AlphaSpeed.MEDIUM, AlphaCurve.LINEAR)
    slot.step_epoch()
    assert slot.alpha.alpha == pytest.approx(0.6) and float(slot.alpha_value) == pytest.approx(0.6)
    assert Blueprint.CONV_LIGHT == slot.blueprint


def _host_with_trained_norms(preset: str = "cifar10") -> CNNHost:
    """A cifar10 host whose batch norms have non-trivial statistics and affines (as after training)."""
    host = CNNHost(HOST_PRESETS[preset])
    with torch.no_grad():
        for block in host.blocks:
            n = block.norm.num_features
            block.norm.weight.copy_(1 + 0.3 * torch.randn(n))
            block.norm.bias.copy_(0.2 * torch.randn(n))
            block.norm.running_mean.copy_(0.5 * torch.randn(n))
            block.norm.running_var.copy_(0.5 + torch.rand(n))
    return host.eval()


def test_a_blocks_folded_convolution_equals_its_convolution_batch_norm_and_relu():
    host = _host_with_trained_norms()
    x = images("cifar10", batch=4)
    with torch.no_grad():
        for block in host.blocks:
            weight, bias = block.folded()
            folded = torch.relu(torch.nn.functional.conv2d(x, weight, bias, padding=block.conv.padding))
            reference = torch.relu(block.norm(block.conv(x)))
            torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)
            x = torch.nn.functional.max_pool2d(reference, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused eval path runs on CUDA (gpu_check.sh runs this)")
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_the_fused_eval_forward_on_cuda_matches_the_unfused_one(monkeypatch, autocast):
    import esper_ray.morpho.host as host_module

    host = _host_with_trained_norms().cuda().to(memory_format=torch.channels_last)
    x = images("cifar10", batch=64).cuda().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), torch.autocast("cuda", dtype=autocast or torch.float32, enabled=autocast is not None):
        fused = host(x).float()
        monkeypatch.setattr(host_module, "FUSED_EVAL", False)
        unfused = host(x).float()
    tolerance = 1e-3 if autocast is None else 5e-2  # cuDNN's fp32 convolutions run on TF32
    torch.testing.assert_close(fused, unfused, rtol=tolerance, atol=tolerance)
    assert fused.argmax(1).eq(unfused.argmax(1)).float().mean() > 0.95
