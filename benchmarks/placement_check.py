"""Which GPU each env process lands on: N Ray actors asking 1/16 of a GPU each, as an A/B's env runners ask, with
Ray's own pick and then through esper_ray.train.process.gpu_spread (as CpuPolicyEnvRunner and a baseline trial do).

    python benchmarks/placement_check.py [--envs 8]

Ray bin-packs fractional GPUs, so Ray alone should put all N on the first GPU; spread, they should be even over
the machine's GPUs. Each actor starts CUDA after the choice and reports the UUID of the GPU its tensor is on (as
nvidia-smi -L lists it), so the figure is where the work runs, not what an environment variable says. Needs 2+ GPUs.
One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import ray
from throughput import machine  # benchmarks/ is on sys.path when this runs as a script


@ray.remote(num_cpus=0)
class EnvProcess:
    def place(self, spread: bool) -> dict[str, object]:
        import esper_ray.train.rllib.env_runner  # noqa: F401  what an env runner has imported before its __init__
        from esper_ray.train.process.gpu_spread import spread_gpu

        chosen = spread_gpu() if spread else None
        import torch

        torch.ones(1 << 20, device="cuda").sum().item()  # CUDA starts here, on whatever is visible now
        return {
            "ray": [str(g) for g in ray.get_gpu_ids()],
            "chosen": chosen,
            "gpu": str(torch.cuda.get_device_properties(0).uuid),
        }


def place(envs: int, spread: bool) -> dict[str, int]:
    actors = [EnvProcess.options(num_gpus=1 / 16).remote() for _ in range(envs)]
    try:
        places = ray.get([a.place.remote(spread) for a in actors], timeout=300)
    finally:
        for a in actors:
            ray.kill(a)
    time.sleep(2)  # the killed processes leave the ledger and the GPUs
    return dict(collections.Counter(str(p["gpu"]) for p in places))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < 2:
        raise SystemExit(f"placement_check: this machine has {gpus} GPU(s); spreading needs 2 or more")
    result = {
        "machine": machine(),
        "envs": args.envs,
        "gpus": gpus,
        "ray_alone": place(args.envs, spread=False),
        "spread": place(args.envs, spread=True),
    }
    ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
