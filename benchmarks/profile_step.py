"""Where one env's GPU time goes: torch.profiler over env steps, kernels ranked by their GPU time.

    python benchmarks/profile_step.py --device cuda               # the throughput benchmark's env, one process
    python benchmarks/profile_step.py --device cuda --no-graphs   # eager train steps (every kernel named)
    python benchmarks/profile_step.py --env graph_validation=false --no-fused-eval   # the validation pass as it was

One env of `benchmarks/throughput.py --gpu` (synthetic CIFAR-shaped data, a 12,500-sample shard, 10,000 validation
samples, batch 512, slot r0c1, random controller), warmed up, then profiled for `--steps` steps. Prints the kernel
time per step of the train epoch, the validation pass and the rest (every kernel and copy on the GPU is charged to
the phase whose GPU-side range holds its start, kernels replayed from a CUDA graph included), validation's share
of it (issue 22's target: <= 15 %), and the kernels with the most GPU time. The last stdout line is one JSON
object with those figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
from throughput import commit  # benchmarks/ is on sys.path when this runs as a script
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

import esper_ray.env.morphogenetic_env as env_module
import esper_ray.morpho.host as host_module
from esper_ray.cli import parse_env_overrides
from esper_ray.env import MorphogeneticEnv
from esper_ray.morpho import fused_block
from esper_ray.policy.baselines import RandomController

PHASES = ("train_epoch", "validation")


def labelled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapper


def kernel_us_by_phase(events: Any) -> dict[str, float]:
    """Microseconds of GPU activity (kernels, copies, sets) per phase, and "other" for what lies outside them."""
    ranges = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.name in PHASES and e.device_type == DeviceType.CUDA
    ]
    totals = dict.fromkeys((*PHASES, "other"), 0.0)
    for e in events:
        if e.device_type != DeviceType.CUDA or e.name in PHASES:
            continue
        start = e.time_range.start
        phase = next((name for lo, hi, name in ranges if lo <= start < hi), "other")
        totals[phase] += e.time_range.elapsed_us()
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape")
    parser.add_argument(
        "--no-fused-eval",
        action="store_true",
        help="eval-mode host blocks as conv, batch norm and ReLU (not folded into one cuDNN call)",
    )
    parser.add_argument(
        "--no-fused-train",
        action="store_true",
        help="train-mode host blocks as separate kernels (not compiled: esper_ray/morpho/fused_block.py)",
    )
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="an env setting (repeatable)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    host_module.FUSED_EVAL = not args.no_fused_eval
    fused_block.ENABLED = not args.no_fused_train
    env_module.train_epoch = labelled("train_epoch", env_module.train_epoch)  # the env calls it through its module
    config = {
        "task": "synthetic",
        "synthetic_size": 12_500,
        "synthetic_held_out": 10_000,
        "batch_size": 512,
        "max_epochs": 20,
        "slots": ["r0c1"],
        "device": args.device,
        "cuda_graphs": not args.no_graphs,
        **parse_env_overrides(args.env),
    }
    env = MorphogeneticEnv(config)
    env.val_graphs.validate = labelled("validation", env.val_graphs.validate)  # eager or captured
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
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {card}, commit {commit()}")
    print(f"settings: {config}")
    print(f"wall per step {wall * 1e3:.1f} ms ({len(env.shard) / wall:,.0f} train samples/s, one process)")
    print(
        "env phases (wall ms/step): "
        + ", ".join(f"{k} {1e3 * v / args.steps:.1f}" for k, v in phases.items())
        + f"; graph captures per step {(env.graphs.captures - captures) / args.steps:.2f}"
    )
    events = prof.key_averages()
    for e in events:
        if e.key in PHASES:
            print(
                f"  {e.key:<12} range on the GPU {e.device_time_total / args.steps / 1e3:8.2f} ms/step   CPU "
                f"{e.cpu_time_total / args.steps / 1e3:8.2f} ms/step"
            )
    kernels = {k: v / args.steps / 1e3 for k, v in kernel_us_by_phase(prof.events()).items()}  # ms per step
    total = sum(kernels.values())
    share = kernels["validation"] / total if total else float("nan")
    train_us = 1e3 * kernels["train_epoch"] / len(env.shard)
    val_us = 1e3 * kernels["validation"] / len(env.val_y)
    print(
        f"  kernels per step: train {kernels['train_epoch']:.2f} ms ({train_us:.3f} us a training sample), validation "
        f"{kernels['validation']:.2f} ms ({val_us:.3f} us a validation sample), other {kernels['other']:.2f} ms; "
        f"validation {100 * share:.1f} % of {total:.2f} ms (GPU busy {100 * total / 1e3 / wall:.0f} % of wall)"
    )
    print(events.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=70))
    print(
        json.dumps(
            {
                "card": card,
                "commit": commit(),
                "torch": torch.__version__,
                "settings": config,
                "fused_eval": not args.no_fused_eval,
                "fused_train": not args.no_fused_train,
                "wall_ms_per_step": round(1e3 * wall, 2),
                "kernel_ms_per_step": {k: round(v, 3) for k, v in kernels.items()},
                "train_us_per_sample": round(train_us, 4),
                "validation_us_per_sample": round(val_us, 4),
                "validation_share": round(share, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
