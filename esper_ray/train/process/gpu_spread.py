"""Spread a node's env processes over its GPUs instead of stacking them on the first one.

Ray bin-packs fractional GPU requests: an env asking 1/16 of a GPU goes to the first GPU with 1/16 left, so on a
4-GPU machine the first 16 such envs all land on GPU 0. An A/B whose trials each ask a little (text.yaml: 4 envs of
1/16) ran its 8 PPO trials on two cards while two idled, their episodes up to 4 times as slow as on the least crowded
(4 x H100: 3.4-14.9 s of training an episode, the same policies' germinations). Ray's accounting is still what
bounds how many envs a node holds; this module only picks which of the node's GPUs an env process uses: the one
whose live env processes hold the least, from a ledger file shared by the node's processes.

It acts only in a Ray worker given one fractional GPU, before CUDA starts in the process (Ray sets
CUDA_VISIBLE_DEVICES to its pick when the actor starts; CUDA reads it once). Whole or several GPUs keep Ray's pick.
The node's GPU ids are ESPER_RAY_NODE_GPUS where the driver set it (a local Ray started under
CUDA_VISIBLE_DEVICES, whose ids are that list), else 0 .. n-1 for the node's n GPUs, as on a `ray start` node.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import ray
import torch

NODE_GPUS_ENV = "ESPER_RAY_NODE_GPUS"
"""Comma-separated GPU ids of the node as Ray names them, where they are not 0 .. n-1."""


def ledger_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"esper-ray-gpus-{os.getuid()}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def least_loaded(candidates: Sequence[str], loads: Mapping[str, float], preferred: str) -> str:
    """The candidate with the least load; among equals `preferred` (Ray's pick), then the lowest in the list."""
    return min(candidates, key=lambda gpu: (round(loads.get(gpu, 0.0), 9), gpu != preferred, candidates.index(gpu)))


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[Path]:
    """The ledger file, held exclusively by this process for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "ledger.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder / "ledger.json"


def claim(folder: Path, pid: int, share: float, candidates: Sequence[str], preferred: str) -> str:
    """Record that `pid` uses `share` of the least-loaded GPU among `candidates` (entries of dead processes are
    dropped first) and return that GPU's id."""
    with locked(folder) as path:
        entries = json.loads(path.read_text()) if path.exists() else {}
        entries = {p: e for p, e in entries.items() if int(p) != pid and alive(int(p))}
        loads: dict[str, float] = {}
        for entry in entries.values():
            loads[entry["gpu"]] = loads.get(entry["gpu"], 0.0) + float(entry["share"])
        gpu = least_loaded(candidates, loads, preferred)
        entries[str(pid)] = {"gpu": gpu, "share": share}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(path)
    return gpu


def gpu_list(ids: str | None) -> list[str]:
    """The GPU ids of a comma-separated list such as CUDA_VISIBLE_DEVICES ("0, 2" -> ["0", "2"]; none for None)."""
    return [gpu.strip() for gpu in (ids or "").split(",") if gpu.strip()]


def node_gpu_ids() -> list[str]:
    """This node's GPU ids as Ray names them (module docstring)."""
    named = gpu_list(os.environ.get(NODE_GPUS_ENV))
    if named:
        return named
    node = ray.get_runtime_context().get_node_id()
    total = next((n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["NodeID"] == node), 0.0)
    return [str(i) for i in range(int(total))]


def single_visible_gpu() -> str | None:
    """The one GPU id this process sees (CUDA_VISIBLE_DEVICES, as Ray or spread_gpu set it); None for none or
    several."""
    ids = gpu_list(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return ids[0] if len(ids) == 1 else None


def spread_gpu() -> str | None:
    """In a Ray worker holding one fractional GPU: point CUDA_VISIBLE_DEVICES at the node's least-loaded GPU and
    return its id; None where Ray's pick stands (no GPU, whole GPUs, CUDA already started, one GPU on the node)."""
    if (
        not ray.is_initialized()
        or ray.get_runtime_context().worker.mode != ray.WORKER_MODE
        or torch.cuda.is_initialized()
    ):
        return None  # outside Ray, in the driver (its local env runner), or too late
    assigned = [str(gpu) for gpu in ray.get_gpu_ids()]
    share = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
    if len(assigned) != 1 or not 0 < share < 1:
        return None
    candidates = node_gpu_ids()
    if len(candidates) < 2 or assigned[0] not in candidates:
        return None
    try:
        gpu = claim(ledger_folder(), os.getpid(), share, candidates, preferred=assigned[0])
    except OSError:  # an unwritable temp folder: Ray's pick still works
        return None
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    return gpu
