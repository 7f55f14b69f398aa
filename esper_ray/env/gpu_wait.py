"""Waiting for a GPU stream without spinning a CPU core.

CUDA's default wait (cudaDeviceScheduleAuto) spins the waiting thread whenever the process has fewer CUDA contexts
than the machine has cores, which is always so here: an env process spins on a core for as long as its epoch's
kernels run, and under MPS, with 16 envs sharing a card, that is most of its step. An A/B can run more such
processes than the machine has cores (text.yaml on 2 x H200: 8 PPO trials of 4 envs and a driver each, on 32
cores), where the spinning ones take cores from those with work to do. An event made with blocking=True
(cudaEventBlockingSync) puts the thread to sleep until the stream reaches it.
"""

from __future__ import annotations

import torch


def wait_for_stream(device: torch.device) -> None:
    """Return once the current stream of `device` has run everything queued on it, asleep meanwhile (a CPU
    device: at once, its work is done). Call before reading a result back (`.tolist()`), whose own wait is then
    short."""
    if device.type != "cuda":
        return
    done = torch.cuda.Event(blocking=True)
    done.record()  # on the current stream: the env's own, inside its `torch.cuda.stream`
    done.synchronize()
