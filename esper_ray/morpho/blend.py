"""Blend operators that combine host features h with seed output s at amplitude alpha (DOMAIN.md section 2).

alpha is a tensor broadcastable to h: a scalar for the live slot or one value per sample ([B, 1, 1, 1] for
CNN features [B, C, H, W], [B, 1, 1] for a transformer's [B, T, C]) for counterfactual passes.
"""

from __future__ import annotations

import torch
from torch import nn

from esper_ray.contracts.actions import BlendAlgorithm
from esper_ray.contracts.host import Topology


class GatedBlend(nn.Module):
    """Per-sample learnable gate: pool -> Linear(C, max(8, C/4)) -> ReLU -> Linear(1) -> sigmoid.

    Pools over space for CNN features [B, C, H, W] (gate [B, 1, 1, 1]) and over the sequence for a
    transformer's [B, T, C] (gate [B, 1, 1]; a sequence-level gate, like the original's).
    """

    def __init__(self, channels: int, topology: Topology = Topology.CNN) -> None:
        super().__init__()
        hidden = max(8, channels // 4)
        self.topology = topology
        self.net = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.topology is Topology.VECTOR:
            return torch.sigmoid(self.net(x))  # [B, 1]
        if self.topology is Topology.TRANSFORMER:
            return torch.sigmoid(self.net(x.mean(dim=1)))[:, :, None]  # [B, 1, 1]
        return torch.sigmoid(self.net(x.mean(dim=(2, 3))))[:, :, None, None]  # [B, 1, 1, 1]


def blend(
    algorithm: BlendAlgorithm,
    host: torch.Tensor,
    seed_out: torch.Tensor,
    seed_in: torch.Tensor,
    alpha: torch.Tensor,
    gate: GatedBlend | None,
) -> torch.Tensor:
    if algorithm is BlendAlgorithm.ADD:
        return host + alpha * (seed_out - host)
    if algorithm is BlendAlgorithm.MULTIPLY:
        # A bounded valve: identity at alpha 0 or zero modulation, in [1 - alpha, 1 + alpha] x host.
        return host * (1.0 + alpha * torch.tanh(seed_out - seed_in))
    if algorithm is BlendAlgorithm.GATE:
        if gate is None:
            raise ValueError("GATE blending needs the seed's gate module")
        return host + alpha * gate(seed_in) * (seed_out - host)
    raise ValueError(f"unknown blend algorithm {algorithm!r}")


def blend_configurations(
    algorithm: BlendAlgorithm,
    host: torch.Tensor,
    seed_out: torch.Tensor,
    seed_in: torch.Tensor,
    alphas: torch.Tensor,
    gate: GatedBlend | None,
) -> torch.Tensor:
    """`blend` under each of K alphas ([K]) of one host/seed pair ([B, ...]): [K*B, ...], configuration-major.

    The seed (and gate) ran once on the B samples; only the blend is repeated K times. Each element is computed
    as `blend` computes it for that configuration (GATE: alpha * gate first, as there).
    """
    k = alphas.shape[0]
    per_config = alphas.view(k, *([1] * host.dim()))  # [K, 1, ...], broadcast over [1, B, ...]
    if algorithm is BlendAlgorithm.GATE:
        if gate is None:
            raise ValueError("GATE blending needs the seed's gate module")
        per_config = per_config * gate(seed_in).unsqueeze(0)
        algorithm = BlendAlgorithm.ADD  # host + (alpha * gate) * (seed_out - host)
    out = blend(algorithm, host.unsqueeze(0), seed_out.unsqueeze(0), seed_in.unsqueeze(0), per_config, None)
    out = out.flatten(0, 1)
    if host.dim() == 4 and host.is_contiguous(memory_format=torch.channels_last):
        out = out.contiguous(memory_format=torch.channels_last)  # the host's layout for the blocks after the slot
    return out
