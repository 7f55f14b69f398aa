"""The env waits for its GPU work asleep (gpu_wait.py): CUDA's default wait spins a core the whole time."""

from __future__ import annotations

import time

import pytest
import torch

from esper_ray.env.gpu_wait import wait_for_stream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/gpu_check.sh runs this)")

GPU_SLEEP_CYCLES = 1_000_000_000
"""About half a second of a kernel that only spins on the GPU (torch.cuda._sleep), at 1-2 GHz."""


def cpu_and_wall_of_a_wait(wait) -> tuple[float, float]:
    torch.cuda.synchronize()
    torch.cuda._sleep(GPU_SLEEP_CYCLES)
    cpu, wall = time.thread_time(), time.perf_counter()
    wait()
    return time.thread_time() - cpu, time.perf_counter() - wall


def test_waiting_for_the_stream_sleeps_where_cuda_s_default_wait_spins():
    cpu, wall = cpu_and_wall_of_a_wait(lambda: wait_for_stream(torch.device("cuda")))
    assert torch.cuda.current_stream().query()  # everything queued has run
    assert wall > 0.1 and cpu < 0.2 * wall, (cpu, wall)
    spin_cpu, spin_wall = cpu_and_wall_of_a_wait(torch.cuda.synchronize)  # the premise: the default wait spins
    assert spin_wall > 0.1 and spin_cpu > 0.5 * spin_wall, (spin_cpu, spin_wall)


def test_the_env_s_own_stream_is_the_one_waited_for():
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(GPU_SLEEP_CYCLES)
        wait_for_stream(torch.device("cuda"))
        assert stream.query()
