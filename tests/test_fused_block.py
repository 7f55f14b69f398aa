"""The host's fused block path: pooling in the block's call, hooks only where a seed runs, fp32 for the image's
channels, the fused training function against a training block, and which batches of an epoch may run compiled."""

from __future__ import annotations

import copy

import pytest
import torch

from esper_ray.contracts.stages import Stage
from esper_ray.data.sharding import DeviceShard
from esper_ray.env import train_step as train_step_module
from esper_ray.env.epoch import train_epoch
from esper_ray.env.train_step import Precision
from esper_ray.morpho import fused_block
from esper_ray.morpho.host import HOST_PRESETS, CNNHost, ConvBlock
from tests.morpho_helpers import drive_to, make_model


def images(preset: str = "cifar10", batch: int = 6, seed: int = 1) -> torch.Tensor:
    cfg = HOST_PRESETS[preset]
    return torch.randn(
        batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=torch.Generator().manual_seed(seed)
    )


def test_a_block_asked_to_pool_equals_the_block_then_max_pool():
    block = ConvBlock(3, 8, 3)
    x = images()
    torch.testing.assert_close(block(x, pool=True), torch.nn.functional.max_pool2d(block(x), 2), rtol=0, atol=0)


def test_the_host_calls_only_hooked_slots_and_applies_them_where_they_sit():
    torch.manual_seed(0)
    host = CNNHost(HOST_PRESETS["cifar10"])
    x = images()
    called: list[str] = []

    def shift_r0c1(slot: str, h: torch.Tensor) -> torch.Tensor:
        called.append(slot)
        return h + 1.0 if slot == "r0c1" else h

    shifted = host(x, shift_r0c1, hooked={"r0c1"})
    assert called == ["r0c1"]
    # By hand: block 1's features shifted before its pool.
    h = torch.nn.functional.max_pool2d(host.blocks[0](x), 2)
    h = torch.nn.functional.max_pool2d(host.blocks[1](h) + 1.0, 2)
    h = torch.nn.functional.max_pool2d(host.blocks[2](h), 2)
    torch.testing.assert_close(shifted, host.head(h.mean(dim=(2, 3))))

    called.clear()
    every = host(x, shift_r0c1)  # hooked=None: every slot's hook is called
    assert called == ["r0c0", "r1c0", "r0c1", "r1c1", "r0c2", "r1c2"]
    torch.testing.assert_close(every, shifted, rtol=0, atol=0)
    called.clear()
    torch.testing.assert_close(host(x, shift_r0c1, hooked=set()), host(x), rtol=0, atol=0)
    assert called == []


def test_the_model_hooks_exactly_its_active_slots():
    model = make_model(["r0c1", "r1c2"], preset="cifar10", auto_forward=False)
    assert model.active_slot_ids() == frozenset()
    drive_to(model.slot("r1c2"), Stage.BLENDING, blueprint="conv_light")
    assert model.active_slot_ids() == frozenset({"r1c2"})
    model.slot("r1c2").alpha_value.fill_(0.5)
    x = images()
    with torch.no_grad():
        blended = model(x)
        bare = model.host(x)
    assert not torch.allclose(blended, bare)  # the seed at r1c2 still runs


def test_in_eval_mode_the_image_block_computes_in_fp32_under_autocast_and_the_next_in_the_autocast_dtype():
    torch.manual_seed(0)
    host = CNNHost(HOST_PRESETS["cifar10"]).eval()
    x = images()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        first = host.blocks[0](x, pool=True)
        second = host.blocks[1](first)
    assert first.dtype == torch.float32 and second.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(first, host.blocks[0](x, pool=True), rtol=0, atol=0)
    host.train()  # training keeps the autocast (a deterministic weight gradient)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert host.blocks[0](x).dtype == torch.bfloat16


@pytest.mark.parametrize("pool", [False, True])
def test_the_fused_training_function_does_what_a_training_block_does(pool):
    torch.manual_seed(0)
    block = ConvBlock(8, 16, 3).train()
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.uniform_(-0.5, 0.5)
    twin = copy.deepcopy(block)
    x = torch.randn(4, 8, 16, 16)
    expected = block(x, pool=pool)
    norm = twin.norm
    got = fused_block.conv_bn_relu(
        x,
        twin.conv.weight,
        norm.weight,
        norm.bias,
        norm.running_mean,
        norm.running_var,
        norm.num_batches_tracked,
        padding=1,
        momentum=norm.momentum,
        eps=norm.eps,
        pool=pool,
    )
    torch.testing.assert_close(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for (name, a), (_, b) in zip(block.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
    for (name, a), (_, b) in zip(block.named_buffers(), twin.named_buffers()):
        torch.testing.assert_close(b, a, msg=name)  # running mean and variance, batches tracked


def test_fusing_is_on_only_inside_its_block_and_only_when_asked(monkeypatch):
    monkeypatch.setattr(fused_block, "available", lambda: True)
    assert not fused_block.active()
    with fused_block.fusing(True):
        assert fused_block.active()
        with fused_block.fusing(False):
            assert not fused_block.active()
        assert fused_block.active()
    assert not fused_block.active()
    monkeypatch.setattr(fused_block, "ENABLED", False)
    with fused_block.fusing(True):
        assert not fused_block.active()


def test_every_batch_of_an_epoch_but_the_last_may_run_fused(monkeypatch):
    asked: list[bool] = []
    real = fused_block.fusing

    def recording(on: bool):  # type: ignore[no-untyped-def]
        asked.append(on)
        return real(on)

    monkeypatch.setattr(train_step_module.fused_block, "fusing", recording)
    model = make_model(["r0c1"], preset="digits")
    optimizer = torch.optim.SGD(model.host.parameters(), lr=0.01)
    shard = DeviceShard(torch.randn(50, 1, 8, 8), torch.arange(50) % 10, torch.device("cpu"))
    stats = train_epoch(
        model,
        optimizer,
        shard,
        batch_size=16,
        generator=torch.Generator().manual_seed(0),
        prepare=lambda x: x,
        precision=Precision(),
        max_grad_norm=1.0,
    )
    assert stats.batches == 4 and asked == [True, True, True, False]


cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or not fused_block.available(),
    reason="the compiled blocks run on CUDA (gpu_check.sh runs this)",
)


@cuda
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_compiled_training_blocks_on_cuda_match_the_plain_ones(dtype):
    torch.manual_seed(0)
    host = CNNHost(HOST_PRESETS["cifar10"]).cuda().to(memory_format=torch.channels_last).train()
    twin = copy.deepcopy(host)
    x = images(batch=64).cuda().contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        plain = host(x)
        with fused_block.fusing(True):
            fused = twin(x)
    tolerance = 1e-3 if dtype is None else 3e-2  # TF32 convolutions; bf16 rounds differently in Triton and cuDNN
    torch.testing.assert_close(fused.float(), plain.float(), rtol=tolerance, atol=tolerance)
    plain.float().square().sum().backward()
    fused.float().square().sum().backward()
    # Gradients as a whole (the relative error of their norm): each is a sum over the batch's pixels of products
    # rounded to bf16, so entries near zero differ by more than any per-entry tolerance. Measured on an H100: at most
    # 1.6e-4 in fp32 and 3.1e-2 in bf16 (the image's block's weight, 3 input channels).
    grad_tolerance = 1e-3 if dtype is None else 1e-1
    for (name, a), (_, b) in zip(host.named_parameters(), twin.named_parameters()):
        error = ((b.grad - a.grad).norm() / a.grad.norm()).item()
        assert error <= grad_tolerance, (name, error)
    for (name, a), (_, b) in zip(host.named_buffers(), twin.named_buffers()):
        torch.testing.assert_close(b.float(), a.float(), rtol=tolerance, atol=tolerance, msg=name)


@cuda
def test_the_env_steps_host_and_seeds_with_fused_sgd_on_cuda():
    from esper_ray.env import MorphogeneticEnv

    env = MorphogeneticEnv({"task": "digits", "device": "cuda", "slots": ["r0c1"], "max_epochs": 2})
    env.reset(seed=0)
    assert env.host_optimizer.defaults["fused"]
    slot = env.model.slot("r0c1")  # type: ignore[union-attr]
    slot.germinate("conv_light")
    assert slot.optimizer is not None and slot.optimizer.defaults["fused"]
