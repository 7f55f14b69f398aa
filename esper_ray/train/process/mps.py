"""A private CUDA MPS control daemon on every GPU node, for one run.

Several env processes on one GPU take turns in time slices: each one's tiny kernels leave the GPU mostly idle
while the others wait. Under MPS (NVIDIA's Multi-Process Service) their kernels run side by side (measured
with esper-ray's env on an H200: 4 processes 283K samples/s without, 428K with; see the README's numbers).

The daemon is the run's own: its pipe and log folders are fresh temporary folders, passed to every worker of
the job through Ray's runtime environment, so it never touches a system MPS daemon or another run's; the GPU's
compute mode is never changed (MPS also works in the default mode). It is stopped when the run ends, on
Ctrl-C and on errors. Off by default: MPS helps when several envs share a GPU, and not with one env per GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

CONTROL = "nvidia-cuda-mps-control"


def mps_environment(run_id: str) -> dict[str, str]:
    base = f"/tmp/esper-ray-mps-{run_id}"
    return {"CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{base}/log"}


def new_run_id() -> str:
    return uuid.uuid4().hex[:10]


def _control(env: dict[str, str], start: bool) -> str:
    """On this node: start the daemon (`-d`) or tell it to quit."""
    if shutil.which(CONTROL) is None:
        raise RuntimeError(f"{CONTROL} is not on this node's PATH: MPS needs the NVIDIA driver's MPS tools")
    full = {**os.environ, **env}
    if start:
        for folder in env.values():
            os.makedirs(folder, exist_ok=True)
        subprocess.run([CONTROL, "-d"], env=full, check=True, timeout=30)
        return ray.get_runtime_context().get_node_id()
    subprocess.run([CONTROL], input="quit\n", text=True, env=full, check=False, timeout=30)
    shutil.rmtree(os.path.dirname(env["CUDA_MPS_PIPE_DIRECTORY"]), ignore_errors=True)
    return ray.get_runtime_context().get_node_id()


_control_task = ray.remote(num_cpus=0)(_control)


def gpu_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0]


def _on_every_gpu_node(env: dict[str, str], start: bool) -> list[str]:
    nodes = gpu_nodes()
    if start and not nodes:
        raise ValueError("mps: no node of this Ray cluster has a GPU; MPS shares GPUs between env processes")
    calls = [
        _control_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(env, start)
        for node in nodes
    ]
    return ray.get(calls)


@contextmanager
def mps_daemons(env: dict[str, str]) -> Iterator[list[str]]:
    """Start the run's daemon on every GPU node (Ray must already run with `env` in its runtime environment);
    stop them all when the block ends, however it ends."""
    started = _on_every_gpu_node(env, start=True)
    try:
        yield started
    finally:
        _on_every_gpu_node(env, start=False)
