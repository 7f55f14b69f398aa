"""CNN host network with named injection slots (DOMAIN.md section 3), and the per-task presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from typing import Any

import torch
from torch import nn

from esper_ray.contracts.host import HostConfig, SlotSpec, Topology
from esper_ray.contracts.slots import action_order, parse_slot_id, slot_id
from esper_ray.morpho import cpu_step, fused_block
from esper_ray.morpho.host_api import HostModule, SlotHook

HOST_PRESETS: dict[str, HostConfig] = {
    # 8x8 grey digits: 8/16/32 channels, two 2x2 pools (8 -> 4 -> 2).
    "digits": HostConfig(in_channels=1, image_size=8, base_channels=8, blocks=3, kernel_size=3, pool_layers=2),
    # A starved host that seeds can rescue: 1x1 kernels see no neighbourhood, 2/4/8 channels.
    "digits-impaired": HostConfig(in_channels=1, image_size=8, base_channels=2, blocks=3, kernel_size=1, pool_layers=2),
    # The original's cifar_baseline host: 8/16/32 channels, 3x3, pooled after every block (~6.4K params).
    "cifar10": HostConfig(in_channels=3, image_size=32, base_channels=8, blocks=3, kernel_size=3, pool_layers=3),
}
HOST_PRESETS["synthetic"] = HOST_PRESETS["cifar10"]


def host_preset(name: str) -> HostConfig:
    if name not in HOST_PRESETS:
        raise ValueError(f"unknown host preset {name!r}; available: {', '.join(sorted(HOST_PRESETS))}")
    return HOST_PRESETS[name]


# Inference on CUDA (eval mode, no autograd: the validation pass): batch norm folded into the convolution, and
# convolution, bias and ReLU in one cuDNN call, so each block's activations are written once instead of three
# times (0.466 -> 0.409 us a validation sample, H100). A switch for `benchmarks/profile_step.py --no-fused-eval`.
FUSED_EVAL = True


class ConvBlock(nn.Module):
    """conv -> batch norm -> ReLU, and the 2x2 max-pool after it when asked.

    `full_precision`: in eval mode, compute in fp32 whatever the autocast. The host's first block reads the image's
    1 to 3 channels, and for so few cuDNN's bf16 convolution is a generic direct kernel: on an H100 its fp32 (TF32)
    one took 682 us for a 10,000-image validation chunk against 1,523 in bf16 (benchmarks/probes/first_conv.py).
    Training keeps the autocast: there fp32 saved little (196 against 259 us for a batch of 512, forward and weight
    gradient) and cuDNN's fp32 weight gradient for 3 channels is a non-deterministic algorithm, which made two eager
    runs of one episode differ (benchmarks/graph_check.py).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, full_precision: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.full_precision = full_precision

    def forward(self, x: torch.Tensor, pool: bool = False) -> torch.Tensor:
        """relu(norm(conv(x))), 2x2 max-pooled if `pool`."""
        if (
            self.full_precision
            and not self.training
            and x.device.type in ("cuda", "cpu")
            and torch.is_autocast_enabled(x.device.type)
        ):
            with torch.autocast(x.device.type, enabled=False):
                return self._forward(x.float(), pool)
        return self._forward(x, pool)

    def _forward(self, x: torch.Tensor, pool: bool) -> torch.Tensor:
        if self.training and x.is_cuda and fused_block.active() and self.norm.momentum is not None:
            norm = self.norm
            return fused_block.run_compiled(
                x,
                self.conv.weight,
                norm.weight,
                norm.bias,
                norm.running_mean,
                norm.running_var,
                norm.num_batches_tracked,
                padding=self.conv.padding[0],
                momentum=norm.momentum,
                eps=norm.eps,
                pool=pool,
            )
        y = self._conv_bn_relu(x)
        return nn.functional.max_pool2d(y, 2) if pool else y

    def _conv_bn_relu(self, x: torch.Tensor) -> torch.Tensor:
        if FUSED_EVAL and x.is_cuda and not self.training and not torch.is_grad_enabled():
            weight, bias = self.folded()
            if torch.is_autocast_enabled(
                x.device.type
            ):  # the fused op is not on autocast's lists: cast as conv2d would
                dtype = torch.get_autocast_dtype(x.device.type)
                x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
            weight = weight.contiguous(
                memory_format=torch.channels_last
                if x.is_contiguous(memory_format=torch.channels_last)
                else torch.contiguous_format
            )
            return torch.cudnn_convolution_relu(
                x, weight, bias, self.conv.stride, self.conv.padding, self.conv.dilation, self.conv.groups
            )
        return torch.relu(self.norm(self._conv(x)))

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.conv.weight
        if weight.shape[2:] == (1, 1) and cpu_step.on(
            x.device
        ):  # stride 1, no padding, no bias: a product over channels
            # contiguous: the layout the convolution gives, which the batch norm and a seed's convolution read fastest
            return nn.functional.linear(x.permute(0, 2, 3, 1), weight.flatten(1)).permute(0, 3, 1, 2).contiguous()
        return self.conv(x)

    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolution's weight and bias with eval-mode batch norm folded in: conv(x, W', b') = BN(conv(x, W))."""
        norm = self.norm
        scale = norm.weight * torch.rsqrt(norm.running_var + norm.eps)  # type: ignore[operator]
        return self.conv.weight * scale.view(-1, 1, 1, 1), norm.bias - norm.running_mean * scale  # type: ignore[operator]


class CNNHost(HostModule):
    """Blocks of conv -> BN -> ReLU with 2x2 max-pooling after the first `pool_layers`, then a linear head.

    Slot r0c{i} sees block i's output before its pooling, r1c{i} after it.
    """

    topology = Topology.CNN

    def __init__(self, cfg: HostConfig) -> None:
        super().__init__()
        self.cfg = cfg
        channels_in = cfg.in_channels
        blocks = []
        for i in range(cfg.blocks):
            blocks.append(ConvBlock(channels_in, cfg.channels(i), cfg.kernel_size, full_precision=i == 0))
            channels_in = cfg.channels(i)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(channels_in, cfg.num_classes)

    @classmethod
    def from_preset(cls, preset: str) -> CNNHost:
        return cls(host_preset(preset))

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> CNNHost:
        return cls(HostConfig(**description))

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self.cfg)

    def slots(self) -> list[SlotSpec]:
        return [SlotSpec(s, self.slot_shape(s), Topology.CNN) for s in self.slot_ids]

    def example_input(self) -> torch.Tensor:
        return torch.zeros(1, self.cfg.in_channels, self.cfg.image_size, self.cfg.image_size)

    @property
    def slot_ids(self) -> list[str]:
        ids = [slot_id(0, i) for i in range(self.cfg.blocks)]
        ids += [slot_id(1, i) for i in range(self.cfg.pool_layers)]
        return action_order(ids)

    def slot_channels(self, slot: str) -> int:
        if slot not in self.slot_ids:
            parse_slot_id(slot)
            raise ValueError(f"slot {slot!r} does not exist in this host; available slots: {self.slot_ids}")
        return self.cfg.channels(parse_slot_id(slot)[1])

    def slot_shape(self, slot: str) -> tuple[int, int, int]:
        """(C, H, W) of the features a slot sees."""
        row, col = parse_slot_id(slot)
        side = self.cfg.spatial(col, after_pool=row == 1)
        return self.slot_channels(slot), side, side

    def forward(
        self, x: torch.Tensor, at_slot: SlotHook | None = None, hooked: Container[str] | None = None
    ) -> torch.Tensor:
        """Logits [B, classes] for images [B, C, H, W]; `at_slot(slot_id, h)` may replace features at a slot.

        `hooked`: the slots whose hook may change their features (None: every slot); the others' hooks are not called.
        A block whose pre-pool slot is not hooked pools in the same call (fused_block.py fuses the two in training on
        CUDA)."""

        def reads(slot: str) -> bool:
            return at_slot is not None and (hooked is None or slot in hooked)

        for i, block in enumerate(self.blocks):
            pooled, reads_before_pool = i < self.cfg.pool_layers, reads(slot_id(0, i))
            x = block(x, pool=pooled and not reads_before_pool)
            if reads_before_pool:
                x = at_slot(slot_id(0, i), x)  # type: ignore[misc]
                if pooled:
                    x = nn.functional.max_pool2d(x, 2)
            if pooled and reads(slot_id(1, i)):
                x = at_slot(slot_id(1, i), x)  # type: ignore[misc]
        return self.head(x.mean(dim=(2, 3)))
