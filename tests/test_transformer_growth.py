"""Growth on the transformer host (issue 19): a kept seed must let the host keep learning, and a seed's whole
lifecycle must fit in the default `text` episode."""

from __future__ import annotations

import copy

import pytest
import torch

from esper_ray.contracts.actions import Style
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.contracts.transformer_host import TransformerHostConfig
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.transformer import TransformerHost, next_token_loss
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

    got = host_gradients(model, next_token_loss(model(idx), targets))
    # Oracle: the same function written out with no isolation at all, h -> h + alpha * (seed(h) - h).
    reference = copy.deepcopy(model)
    seed = reference.slot("r0c2").seed
    hook = lambda s, h: h + alpha * (seed(h) - h) if s == "r0c2" else h  # noqa: E731
    expected = host_gradients(reference, next_token_loss(reference.host(idx, at_slot=hook), targets))

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
    got = host_gradients(seeded, next_token_loss(seeded(idx), targets))
    expected = host_gradients(bare, next_token_loss(bare(idx), targets))
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    assert all(p.grad is not None for p in seeded.slot("r0c1").seed_parameters()[-2:])  # fc2 learns from birth


def test_a_cnn_seed_stays_isolated_after_training():
    model = make_model(["r0c1"], auto_forward=False)
    slot = model.slot("r0c1")
    drive_to(slot, Stage.HOLDING, blueprint="conv_light", style=Style.LINEAR_ADD)
    assert slot.isolated  # DOMAIN.md section 2: CNN seeds keep reading host.detach()
