"""Growth on the transformer host (issue 19): a kept seed must let the host keep learning, and a seed's whole
lifecycle must fit in the default `text` episode."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from esper_ray.contracts.actions import Blueprint, Style, Tempo
from esper_ray.contracts.controllers import FixedSeed
from esper_ray.contracts.env_config import DEFAULT_MAX_EPOCHS, EnvConfig
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.contracts.transformer_host import TransformerHostConfig
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.train_step import prediction_loss
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.transformer import TRANSFORMER_PRESETS, TransformerHost
from esper_ray.policy.baselines import NoGrowthController
from esper_ray.policy.fixed import FixedSeedController
from esper_ray.train.commands.episodes import run_episode
from tests.morpho_helpers import drive_to, make_model

SMALL = TransformerHostConfig(vocab_size=256, seq_len=16, d_model=32, n_heads=4, n_layers=3)


def host_gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.host.named_parameters() if p.grad is not None}  # type: ignore[union-attr]


@pytest.mark.parametrize("stage", [Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED])
@pytest.mark.parametrize("blueprint", ["mlp", "lora", "attention", "norm"])
def test_a_blended_transformer_seed_passes_the_host_its_exact_gradient(stage, blueprint):
    torch.manual_seed(0)
    model = MorphogeneticModel(TransformerHost(SMALL), ["r0c2"], LifecycleConfig(auto_forward=False))
    slot = model.slot("r0c2")
    drive_to(slot, stage, blueprint=blueprint, style=Style.LINEAR_ADD)
    if stage is Stage.BLENDING:
        slot.step_epoch()  # partway up the ramp: 0 < alpha < 1
    alpha = slot.alpha.alpha
    assert 0 < alpha <= 1
    with torch.no_grad():
        for p in slot.seed_parameters():  # a seed that has learned something (zero-initialised layers too)
            p.add_(0.05 * torch.randn_like(p))
    idx = torch.randint(0, 256, (4, SMALL.seq_len), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(idx, -1, dims=1)

    got = host_gradients(model, prediction_loss(model(idx), targets))
    # Oracle: the same function written out with no isolation at all, h -> h + alpha * (seed(h) - h).
    reference = copy.deepcopy(model)
    seed = reference.slot("r0c2").seed
    hook = lambda s, h: h + alpha * (seed(h) - h) if s == "r0c2" else h  # noqa: E731
    expected = host_gradients(reference, prediction_loss(reference.host(idx, at_slot=hook), targets))

    assert got.keys() == expected.keys()
    block0 = "blocks.0.attn.qkv.weight"
    assert float(got[block0].abs().sum()) > 0  # the blocks below the slot still learn (they got 0 at alpha 1 before)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)


def test_a_training_transformer_seed_still_leaves_the_host_gradients_unchanged():
    torch.manual_seed(0)
    seeded = MorphogeneticModel(TransformerHost(SMALL), ["r0c1"], LifecycleConfig(auto_forward=False))
    bare = copy.deepcopy(seeded)
    drive_to(seeded.slot("r0c1"), Stage.TRAINING, blueprint="mlp")
    idx = torch.randint(0, 256, (4, SMALL.seq_len), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(idx, -1, dims=1)
    got = host_gradients(seeded, prediction_loss(seeded(idx), targets))
    expected = host_gradients(bare, prediction_loss(bare(idx), targets))
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    assert all(p.grad is not None for p in seeded.slot("r0c1").seed_parameters()[-2:])  # fc2 learns from birth


def test_a_cnn_seed_stays_isolated_after_training():
    model = make_model(["r0c1"], auto_forward=False)
    slot = model.slot("r0c1")
    drive_to(slot, Stage.HOLDING, blueprint="conv_light", style=Style.LINEAR_ADD)
    assert slot.isolated  # DOMAIN.md section 2: CNN seeds keep reading host.detach()


@pytest.mark.parametrize(("window", "changed"), [(None, list(range(6, 16))), (1, [6]), (3, [6, 7, 8])])
def test_a_windowed_host_sees_only_the_last_bytes_of_its_window(window, changed):
    torch.manual_seed(0)
    host = TransformerHost(
        TransformerHostConfig(vocab_size=256, seq_len=16, d_model=32, n_heads=4, n_layers=1, attention_window=window)
    ).eval()
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    edited = idx.clone()
    edited[:, 6] = (edited[:, 6] + 1) % 256
    with torch.no_grad():
        moved = (host(edited) - host(idx)).abs().amax(dim=(0, 2))
    assert torch.nonzero(moved > 0).flatten().tolist() == changed  # one block: position t reads bytes t-window+1..t


def test_the_starved_text_host_predicts_from_the_current_byte_alone():
    assert TRANSFORMER_PRESETS["text-starved"] == replace(TRANSFORMER_PRESETS["text"], attention_window=1)
    with pytest.raises(ValueError, match="attention_window"):
        TransformerHostConfig(attention_window=0)


SMALL_TEXT = {"task": "text", "text_max_bytes": 30_000, "device": "cpu"}


@pytest.mark.expensive
def test_a_scripted_controller_fossilizes_a_transformer_seed_within_the_default_text_episode():
    env = MorphogeneticEnv(SMALL_TEXT)
    assert env.cfg.max_epochs == DEFAULT_MAX_EPOCHS
    stages: list[str] = []
    controller = FixedSeedController(env.slot_ids, env.cfg.max_epochs, FixedSeed(Blueprint.MLP, "r0c0"), 10)
    summary = run_episode(
        env, controller, 0, reset_seed=0, on_step=lambda step, info: stages.append(info["stages"]["r0c0"])
    )
    # germinated at the first decision, 10 epochs of TRAINING, the standard 5-epoch blend, kept at the first legal step
    first = {stage: stages.index(stage) + 1 for stage in dict.fromkeys(stages)}
    assert first == {"TRAINING": 1, "BLENDING": 11, "HOLDING": 16, "FOSSILIZED": 17}
    assert summary.steps == DEFAULT_MAX_EPOCHS and summary.fossilized >= 1
    assert summary.final_accuracy > summary.initial_accuracy + 0.1  # the host kept learning around its kept seed


# Held-out per-token accuracy a kept seed may cost the host, on the mean of 3 seeds. Issue 19 measured 20 points
# (40-epoch episodes); this short setting gave -4.7 points with 77fb32c's isolated seed and -0.0 now, with single seeds
# within +-2.6 points of no growth (SGD at 0.3 on a 30 KB corpus is noisy: hence the mean). The margin leaves another
# CPU's trajectories about two standard deviations of the mean; the exact-gradient tests above pin the cause itself.
FOSSIL_MARGIN = 0.035


@pytest.mark.expensive
def test_a_fossilized_transformer_seed_costs_the_host_no_accuracy_on_several_seeds():
    short = {**SMALL_TEXT, "max_epochs": 10, "min_training_epochs": 2}  # fossilized at epoch 7, 3 epochs to go
    grown, bare = [], []
    for seed in (0, 1, 2):
        env = MorphogeneticEnv({**short, "seed": seed})
        kept = FixedSeed(Blueprint.MLP, "r0c0", style=Style.LINEAR_ADD, tempo=Tempo.FAST)
        summary = run_episode(
            env, FixedSeedController(env.slot_ids, 10, kept, 2), 0, reset_seed=seed, measure_test=True
        )
        assert summary.fossilized >= 1 and env.model.slot("r0c0").stage is Stage.FOSSILIZED
        grown.append(summary.test_accuracy)
        env = MorphogeneticEnv({**short, "seed": seed})
        bare.append(
            run_episode(env, NoGrowthController(env.slot_ids), 0, reset_seed=seed, measure_test=True).test_accuracy
        )
    print(f"test accuracy with a kept mlp seed {grown}, without growth {bare}")
    assert sum(grown) / 3 > sum(bare) / 3 - FOSSIL_MARGIN, (grown, bare)


def test_a_seed_learns_at_seed_lr_while_training_and_at_the_blended_rate_once_it_blends():
    torch.manual_seed(0)
    lifecycle = LifecycleConfig(auto_forward=False, seed_lr=0.01, blended_seed_lr=0.3)
    model = MorphogeneticModel(TransformerHost(SMALL), ["r0c0", "r0c1"], lifecycle)
    drive_to(model.slot("r0c0"), Stage.TRAINING, blueprint="attention")
    drive_to(model.slot("r0c1"), Stage.FOSSILIZED, blueprint="attention")
    assert [g["lr"] for g in model.slot("r0c0").optimizer.param_groups] == [0.01]
    assert [g["lr"] for g in model.slot("r0c1").optimizer.param_groups] == [0.3]


@pytest.mark.parametrize(
    ("settings", "blended"),
    [
        ({"task": "text"}, 0.3),  # the text host's learning rate
        ({"task": "text", "host_lr": 0.1}, 0.1),
        ({"task": "text", "blended_seed_lr": 0.05}, 0.05),
        ({"task": "digits-impaired"}, 0.01),  # image tasks keep seed_lr, as measured there
    ],
)
def test_the_blended_seed_rate_follows_the_text_host_and_keeps_seed_lr_on_images(settings, blended):
    assert EnvConfig(**settings).lifecycle.blended_seed_lr == blended
    with pytest.raises(ValueError, match="blended_seed_lr=0"):
        EnvConfig(**{**settings, "blended_seed_lr": 0})
