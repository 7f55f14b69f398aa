"""Every seed can learn from birth: under every style, a loss on its output gives its parameters a gradient.

A seed whose gradient is exactly 0 at birth never changes (nothing else moves it), so it can never pass G2 or be
kept: the original's conv_small (a zeroed convolution in front of GN and ReLU) and its MULTIPLY conv and depthwise
seeds (the same zero, made by MULTIPLY's zeroed last affine layer) were such seeds. Identity at birth, where a
blueprint promises it, is checked beside it."""

from __future__ import annotations

import pytest
import torch

from esper_ray.contracts.actions import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS, BlendAlgorithm, Style
from esper_ray.contracts.host import Topology
from esper_ray.morpho.blueprints import build_seed

IDENTITY_AT_BIRTH = {"norm", "conv_small", "bottleneck"}  # CNN seeds that promise it under ADD and GATE too
CASES = [(Topology.CNN, b, s) for b in CNN_BLUEPRINTS for s in Style] + [
    (Topology.TRANSFORMER, b, s) for b in TRANSFORMER_BLUEPRINTS for s in Style
]


def features(topology: Topology, channels: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    shape = (4, channels, 6, 6) if topology is Topology.CNN else (4, 5, channels)
    return torch.randn(shape, generator=gen)


@pytest.mark.parametrize(("topology", "blueprint", "style"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_every_seed_gets_a_gradient_at_birth_under_every_style(topology, blueprint, style):
    if blueprint.key == "flex_attention":
        pytest.skip("FlexAttention has no backward on a CPU (the CUDA check in benchmarks/gpu_check.sh runs it)")
    channels = 16 if topology is Topology.CNN else 32
    torch.manual_seed(1)
    seed = build_seed(blueprint, channels, topology, multiply=style.algorithm is BlendAlgorithm.MULTIPLY)
    x = features(topology, channels)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    (seed(x) * weights).sum().backward()  # a generic loss downstream: what a TRAINING seed receives (dL/ds)
    total = sum(float(p.grad.abs().sum()) for p in seed.parameters() if p.grad is not None)
    assert total > 0, f"{blueprint.key} under {style.name} is born dead: no parameter gets a gradient"


@pytest.mark.parametrize("blueprint", [b for b in CNN_BLUEPRINTS if b.key != "attention"], ids=lambda b: b.key)
def test_cnn_seeds_are_the_identity_at_birth_under_multiply_and_where_they_promise_it(blueprint):
    """(attention is x * sigmoid(3) at birth under any style, as the original's: DOMAIN.md section 4)"""
    x = features(Topology.CNN, 16)
    torch.manual_seed(1)
    assert torch.equal(build_seed(blueprint, 16, Topology.CNN, multiply=True)(x), x)
    assert torch.equal(build_seed(blueprint, 16, Topology.CNN)(x), x) is (blueprint.key in IDENTITY_AT_BIRTH)
