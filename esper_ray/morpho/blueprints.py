"""The seven CNN seed blueprints (DOMAIN.md section 4). Every seed maps [B, C, H, W] to the same shape.

Seeds are residual (`s = x + delta(x)`) unless stated; `norm`, `conv_small` and `bottleneck` are exact
identities at birth, `attention` multiplies by sigmoid(3) ~ 0.95, and `depthwise`, `conv_light`,
`conv_heavy` start from the default init (not identity).

Identity at birth must leave the seed a gradient. The original zeroed the convolution in front of GN and ReLU
(conv_small always; depthwise, conv_light and conv_heavy under MULTIPLY, whose last affine layer it zeroes): the
branch is then relu(0 * weight + 0), whose gradient is exactly 0 for every parameter, so the seed never learned,
never passed G2 and was pruned or dropped. Those seeds start at zero with a scalar `gain` after the ReLU instead
(x + gain * relu(GN(conv(x))), gain 0 at birth): the gain gets a gradient at once, the convolutions as soon as it
moves (`tests/test_blueprints.py` checks every blueprint under every style).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from esper_ray.contracts import registry
from esper_ray.contracts.actions import (
    CNN_BLUEPRINTS,
    TRANSFORMER_BLUEPRINTS,
    Blueprint,
    BlueprintId,
    parse_blueprint,
    topology_blueprints,
)
from esper_ray.contracts.host import Topology
from esper_ray.morpho.transformer_blueprints import build_transformer_seed


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with the largest of 32/16/8/4/2 groups that leaves >= 16 channels per group, else 1."""
    groups = next((g for g in (32, 16, 8, 4, 2) if channels % g == 0 and channels // g >= 16), 1)
    return nn.GroupNorm(groups, channels)


class NormSeed(nn.Module):
    """x + tanh(s) * (GroupNorm(x) - x); s starts at 0, so the seed is the identity at birth."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = group_norm(channels)
        self.scale = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.scale) * (self.norm(x) - x)

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.scale


class AttentionSeed(nn.Module):
    """Squeeze-excite: x * sigmoid(W2 relu(W1 pool(x)) + b2), W2 = 0 and b2 = 3 at birth (x * 0.95)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = max(1, channels // 4)
        self.squeeze = nn.Linear(channels, hidden, bias=False)
        self.excite = nn.Linear(hidden, channels)
        nn.init.zeros_(self.excite.weight)
        nn.init.constant_(self.excite.bias, 3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.sigmoid(self.excite(torch.relu(self.squeeze(x.mean(dim=(2, 3))))))  # [B, C]
        return x * weights[:, :, None, None]

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.excite.weight


def zero_gain(zero_at_birth: bool) -> nn.Parameter | None:
    """The output gain of a branch that ends in a ReLU, 0 at birth, or none (see the module docstring)."""
    return nn.Parameter(torch.zeros(1)) if zero_at_birth else None


def gained(gain: nn.Parameter | None, branch: torch.Tensor) -> torch.Tensor:
    return branch if gain is None else gain * branch


class DepthwiseSeed(nn.Module):
    """x + relu(GN(pointwise(depthwise3x3(x)))), times a gain that is 0 at birth under MULTIPLY."""

    def __init__(self, channels: int, zero_at_birth: bool = False) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.pointwise = nn.Conv2d(channels, channels, 1, bias=False)
        self.norm = group_norm(channels)
        self.gain = zero_gain(zero_at_birth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + gained(self.gain, torch.relu(self.norm(self.pointwise(self.depthwise(x)))))


class BottleneckSeed(nn.Module):
    """x + GN(up1x1(relu(conv3x3(relu(down1x1(x)))))); `up` is zero at birth, so the seed is the identity."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = max(8, channels // 4)
        self.down = nn.Conv2d(channels, hidden, 1, bias=False)
        self.conv = nn.Conv2d(hidden, hidden, 3, padding=1, bias=False)
        self.up = nn.Conv2d(hidden, channels, 1, bias=False)
        self.norm = group_norm(channels)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.up(torch.relu(self.conv(torch.relu(self.down(x))))))

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.up


class ConvSeed(nn.Module):
    """x + relu(GN(conv_kxk(x))) repeated `depth` times inside one residual, times a gain that is 0 at birth when
    asked (conv_small always, any under MULTIPLY)."""

    def __init__(self, channels: int, kernel_size: int, depth: int = 1, zero_at_birth: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [
                nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, bias=False),
                group_norm(channels),
                nn.ReLU(),
            ]
        self.body = nn.Sequential(*layers)
        self.gain = zero_gain(zero_at_birth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + gained(self.gain, self.body(x))


# Each builder takes the channels and whether the seed must be the identity at birth (MULTIPLY); those whose last
# affine layer can simply be zeroed (`last_affine`) get that, those whose branch ends in a ReLU a zero gain. They
# register under these names for topology cnn (contracts/registry.py), as a plug-in's blueprint builders do.
CNN_BUILDERS: dict[str, Callable[[int, bool], nn.Module]] = {
    "norm": lambda c, z: zeroed(NormSeed(c), z),
    "attention": lambda c, z: zeroed(AttentionSeed(c), z),
    "depthwise": lambda c, z: DepthwiseSeed(c, zero_at_birth=z),
    "bottleneck": lambda c, z: zeroed(BottleneckSeed(c), z),
    "conv_small": lambda c, z: ConvSeed(c, kernel_size=1, zero_at_birth=True),
    "conv_light": lambda c, z: ConvSeed(c, kernel_size=3, zero_at_birth=z),
    "conv_heavy": lambda c, z: ConvSeed(c, kernel_size=3, depth=2, zero_at_birth=z),
}
assert sorted(CNN_BUILDERS) == sorted(b.key for b in CNN_BLUEPRINTS), "every CNN blueprint needs a builder"
# The transformer seeds are identities at birth already; MULTIPLY zeroes their last affine map all the same.
TRANSFORMER_BUILDERS: dict[str, Callable[[int, bool], nn.Module]] = {
    b.key: (lambda c, z, b=b: zeroed(build_transformer_seed(b, c, inference_only=True), z))
    for b in TRANSFORMER_BLUEPRINTS
}
HOSTS_OF = {Topology.CNN: "CNN hosts", Topology.TRANSFORMER: "transformer hosts", Topology.VECTOR: "vector hosts"}


def resolve_blueprint(name: str | BlueprintId, topology: Topology = Topology.CNN) -> BlueprintId:
    """Accept a blueprint or its name (a plug-in's too), among those registered for the topology; raise ValueError
    naming them otherwise."""
    return parse_blueprint(name, topology_blueprints(topology.value), HOSTS_OF[topology])


def build_seed(
    blueprint: str | BlueprintId,
    channels: int,
    topology: Topology = Topology.CNN,
    device: torch.device | str = "cpu",
    *,
    inference_only: bool = False,
    multiply: bool = False,
) -> nn.Module:
    """A fresh seed module (built on the CPU) for a slot with `channels` channels of a host of this topology, from
    the builder registered for it (contracts/registry.py). No silent fallback for unknown names; `device` only
    decides whether flex_attention can train there (`inference_only` skips that check: see build_transformer_seed).
    `multiply`: the seed blends by MULTIPLY, so its branch starts at zero (DOMAIN.md: the last affine layer zeroed;
    here a zero gain where that would kill the gradient, see the module docstring); a saved MULTIPLY seed is
    rebuilt with it, as its parameters differ."""
    resolved = resolve_blueprint(blueprint, topology)
    if resolved is Blueprint.FLEX_ATTENTION and not inference_only:
        build_transformer_seed(resolved, 1, device)  # raises where flex_attention cannot train
    builder = registry.resolve(registry.blueprint(topology.value, resolved.key).entry_point)
    return builder(channels, multiply)


def zeroed(seed: nn.Module, zero: bool) -> nn.Module:
    """The seed with its last affine layer zeroed when `zero` (the MULTIPLY operator's identity at birth)."""
    if zero:
        target = seed.last_affine()  # type: ignore[operator]
        with torch.no_grad():
            for p in [target] if isinstance(target, nn.Parameter) else list(target.parameters(recurse=False)):
                p.zero_()
    return seed


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
