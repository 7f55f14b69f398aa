"""How many threads torch may use in a process that steps envs, and the one line that says so.

Every such process is given a share of the machine: an env runner or a baseline A/B trial its CPUs from Ray, a
command (`heuristic`, `eval`) its `--threads`. torch's default is a thread per core, so processes side by side
oversubscribe the cores: on a shared 2-core machine 9 evaluation episodes took about 720 s with the default and 15
took 56 s with one thread (issue 67), and `heuristic` ran 3.5-5x faster beside other envs with one. The CNN hosts
are too small to use a second thread anyway (their kernels are microseconds), so the commands default to one.
"""

from __future__ import annotations

import math

COMMAND_THREADS = 1
"""The `--threads` default of `heuristic` and `eval`."""


def threads_of_cpus(cpus: float) -> int:
    """floor(CPUs), at least 1: a fraction of a core still runs one thread."""
    return max(1, math.floor(cpus))


def ray_cpu_share() -> int | None:
    """threads_of_cpus(the CPUs Ray assigned to this worker); None outside a Ray worker."""
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return None
    return threads_of_cpus(context.get_assigned_resources().get("CPU", 1.0))


def use_threads(threads: int) -> int:
    """Let torch use `threads` intra-op threads in this process; returns the number torch now uses."""
    if threads < 1:
        raise ValueError(f"threads={threads}: must be >= 1")
    import torch  # here, not at the top: the command line module imports this one before torch (issue 69, item 8)

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def threads_line(threads: int) -> str:
    return f"torch threads: {threads}"
