"""Seconds per MorphogeneticEnv step, split into phases, on the machine it runs on.

    python benchmarks/env_step.py --task digits --steps 40 [--device cuda] [--num-shards 1]

Runs the heuristic controller (so seeds germinate, blend and get validated) and prints the mean seconds per
step of each phase: decision, train (one host epoch), val (fused counterfactual pass), lifecycle, reward,
observation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from esper_ray.contracts.env_config import AMP_MODES
from esper_ray.env import MorphogeneticEnv
from esper_ray.policy.heuristic import HeuristicController
from throughput import commit  # benchmarks/ is on sys.path when this runs as a script


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {gpu}, "
            f"commit {commit()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-shards", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--amp", default="auto", choices=AMP_MODES, help="auto: bf16 on a GPU, fp32 on a CPU")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = MorphogeneticEnv({"task": args.task, "max_epochs": args.steps, "device": args.device,
                            "num_shards": args.num_shards, "batch_size": args.batch_size, "amp": args.amp})
    controller = HeuristicController(env.slot_ids, args.steps)
    obs, _ = env.reset(seed=0)
    phases: dict[str, list[float]] = {}
    start = time.perf_counter()
    for _ in range(args.steps):
        obs, _, terminated, truncated, info = env.step(controller.act(obs))
        for key, value in info.items():
            if key.startswith("time/"):
                phases.setdefault(key[5:], []).append(value)
        if terminated or truncated:
            break
    wall = (time.perf_counter() - start) / args.steps
    means = {k: statistics.fmean(v) for k, v in phases.items()}
    samples = len(env.shard)
    if args.json:
        print(json.dumps({"machine": machine(), "task": args.task, "step_s": wall, "phases_s": means, "shard_samples": samples}))
        return
    print(f"machine: {machine()}")
    print(f"task {args.task}, shard of {samples} training samples, batch {env.cfg.effective_batch_size}, "
          f"amp {args.amp}, {args.steps} steps on {env.device}")
    print(f"seconds per env step: {wall:.4f}  ({samples / means['train']:,.0f} training samples/s in the train phase)")
    for name, value in means.items():
        print(f"  {name:<12}{value:.4f} s  ({100 * value / wall:.1f} %)")


if __name__ == "__main__":
    main()
