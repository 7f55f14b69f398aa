"""A CNN host block's training forward, convolution -> batch norm -> ReLU (-> 2x2 max-pool), compiled as one function.

Why: the image hosts' layers have 8 to 32 channels, so a training step is many short kernels, and cuDNN's batch norm
and ATen's channels-last max-pool are among the costliest of them. Through torch.compile, Inductor keeps cuDNN's
convolution and writes the batch norm's statistics and normalisation, the ReLU and the pool, forward and backward,
as a few Triton kernels. Measured in a captured step of the cifar10 host (benchmarks/probes/fusion_probe.py, one
H200, bf16): 1.628 -> 1.293 us of GPU time a training sample; four processes under MPS 1,055,302 -> 1,335,862
samples/s.

Where: only inside `fusing(True)`, which the env's train step enters for every batch of an epoch but the last
(train_step.py). Those batches all have the env's batch size, so each block is compiled once per batch shape,
precision and pooling (`dynamic=False`), in the step's eager warm-up, never during a CUDA-graph capture. The epoch's
last batch, the validation pass and everything on the CPU run the plain modules. `available()` says whether this
process can compile for the GPU at all (Triton); where it cannot, the plain modules run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache

import torch
import torch.nn.functional as F

# A switch for benchmarks (benchmarks/profile_step.py --no-fused-train): False keeps the plain modules everywhere.
ENABLED = True
# Compiled versions of conv_bn_relu a process may keep (dynamo's default is 8 a function). The cifar10 host needs 4 or
# 5 (3 blocks, one of them with and without its pool where a seed reads its features), a test process a few hosts'.
RECOMPILE_LIMIT = 32
_fusing = False


@contextlib.contextmanager
def fusing(on: bool) -> Iterator[None]:
    """Within the block, CNN host blocks training on CUDA run compiled (when `on` and available)."""
    global _fusing
    previous, _fusing = _fusing, on and ENABLED and available()
    try:
        yield
    finally:
        _fusing = previous


def active() -> bool:
    return _fusing


@cache
def available() -> bool:
    """Torch was built with a Triton that can compile for this process's GPU."""
    from torch.utils._triton import has_triton

    return torch.cuda.is_available() and has_triton()


def conv_bn_relu(
    x: torch.Tensor,
    weight: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    batches_tracked: torch.Tensor,
    *,
    padding: int,
    momentum: float,
    eps: float,
    pool: bool,
) -> torch.Tensor:
    """What ConvBlock does in training (batch statistics, running statistics updated in place), then the pool."""
    batches_tracked.add_(1)
    y = F.conv2d(x, weight, None, 1, padding)
    y = torch.relu(F.batch_norm(y, running_mean, running_var, gamma, beta, True, momentum, eps))
    return F.max_pool2d(y, 2) if pool else y


@cache
def _compiled():  # type: ignore[no-untyped-def]
    """conv_bn_relu through torch.compile (made on first use: importing the compiler costs seconds)."""
    return torch.compile(conv_bn_relu, dynamic=False)


def run_compiled(
    x: torch.Tensor, *tensors: torch.Tensor, padding: int, momentum: float, eps: float, pool: bool
) -> torch.Tensor:
    """conv_bn_relu, compiled. The input is first brought to what the convolution computes in (channels-last, the
    autocast dtype), as the plain modules would, so that only a block's shape and pooling tell its compiled versions
    apart: a few per host. Each block of each host a process trains is one version, within the limit set here."""
    x = x.contiguous(memory_format=torch.channels_last)
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return _compiled()(x, *tensors, padding=padding, momentum=momentum, eps=eps, pool=pool)
