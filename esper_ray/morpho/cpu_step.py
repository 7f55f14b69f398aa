"""The CPU path of a tiny host's training step: the same step in fewer, cheaper calls (issue 67).

On a CPU the CNN hosts are bound by calls, not arithmetic: a digits-impaired batch of 64 is a few MFLOPs, yet took
~3 ms, most of it oneDNN's set-up of 1x1 convolutions on few-channel maps (~100 us a call, forward or backward),
the optimizers' Python and per-tensor kernels, and clip_grad_norm_'s grouping (docs/performance.md, "On a CPU").
So on the CPU: a 1x1 host convolution is a matrix product over the channels (morpho/host.py); the step clears and
clips the gradients itself and calls torch's functional SGD without Optimizer.step's wrapper (env/train_step.py); and
SGD runs its fused kernel, one call for all of an optimizer's tensors instead of a kernel per tensor.
Each computes what the plain path does, to float rounding: the data order, batches, losses and decisions are the
same (tests/test_cpu_step.py trains an episode both ways). torch.compile does not pay here: compiling one host
block took 23 s and its step was slower than the eager one.

`ENABLED` is a switch for benchmarks/env_step.py --plain and for that test.
"""

from __future__ import annotations

import torch

ENABLED = True


def on(device: torch.device) -> bool:
    """Whether tensors on `device` take this path."""
    return ENABLED and device.type == "cpu"


def fused_sgd(device: torch.device) -> bool:
    """SGD's fused kernel: on CUDA one launch a step instead of several; on the CPU one call instead of a kernel per
    tensor."""
    return device.type == "cuda" or on(device)
