"""Where one env's GPU time goes: torch.profiler over env steps, kernels ranked by their GPU time.

    python benchmarks/profile_step.py --device cuda               # the throughput benchmark's env, one process
    python benchmarks/profile_step.py --device cuda --no-graphs   # eager train steps (every kernel named)

One env of `benchmarks/throughput.py --gpu` (synthetic CIFAR-shaped data, a 12,500-sample shard, 10,000 validation
samples, batch 512, slot r0c1, random controller), warmed up, then profiled for `--steps` steps. Prints the GPU
time per step of the train epoch, the validation pass and the rest, and the kernels with the most GPU time.
Kernels replayed from a CUDA graph are attributed to the phase that launched the graph.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import esper_ray.env.morphogenetic_env as env_module
from esper_ray.cli import parse_env_overrides
from esper_ray.env import MorphogeneticEnv
from esper_ray.policy.baselines import RandomController

PHASES = ("train_epoch", "validate_fused")


def labelled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="an env setting (repeatable)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    for name in PHASES:  # the env calls these through its module's names
        setattr(env_module, name, labelled(name, getattr(env_module, name)))
    config = {"task": "synthetic", "synthetic_size": 12_500, "synthetic_held_out": 10_000, "batch_size": 512, "max_epochs": 20, "slots": ["r0c1"],
              "device": args.device, "cuda_graphs": not args.no_graphs, **parse_env_overrides(args.env)}
    env = MorphogeneticEnv(config)
    controller = RandomController(env.slot_ids, seed=0)
    obs, _ = env.reset(seed=0)

    phases: dict[str, float] = {}

    def step() -> None:
        nonlocal obs
        obs, _, terminated, _, info = env.step(controller.act(obs))
        for key, value in info.items():
            if key.startswith("time/"):
                phases[key[5:]] = phases.get(key[5:], 0.0) + value
        if terminated:
            obs, _ = env.reset()

    for _ in range(args.warmup):
        step()
    cuda = env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    phases.clear()
    captures = env.graphs.captures
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        sync()
    wall = (time.perf_counter() - start) / args.steps
    card = torch.cuda.get_device_name(0) if cuda else "no GPU"
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {card}")
    print(f"settings: {config}")
    print(f"wall per step {wall * 1e3:.1f} ms ({len(env.shard) / wall:,.0f} train samples/s, one process)")
    print("env phases (wall ms/step): " + ", ".join(f"{k} {1e3 * v / args.steps:.1f}" for k, v in phases.items())
          + f"; graph captures per step {(env.graphs.captures - captures) / args.steps:.2f}")
    events = prof.key_averages()
    gpu_total = sum(e.self_device_time_total for e in events if e.key not in PHASES) / args.steps  # kernels only
    for e in events:
        if e.key in PHASES:
            print(f"  {e.key:<16} GPU {e.device_time_total / args.steps / 1e3:8.2f} ms/step   CPU "
                  f"{e.cpu_time_total / args.steps / 1e3:8.2f} ms/step")
    print(f"  all kernels      GPU {gpu_total / 1e3:8.2f} ms/step (GPU busy {100 * gpu_total / 1e6 / wall:.0f} % of wall)")
    print(events.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=70))


if __name__ == "__main__":
    main()
