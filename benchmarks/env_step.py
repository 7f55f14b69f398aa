"""Seconds per MorphogeneticEnv step, split into phases, on the machine it runs on.

    python benchmarks/env_step.py --task digits --steps 40 [--device cuda] [--num-shards 1]

Runs the heuristic controller (so seeds germinate, blend and get validated) and prints the mean seconds per
step of each phase: decision, train (one host epoch), val (fused counterfactual pass), lifecycle, reward,
observation; then the train phase's own split: drawing the epoch's data, the forward pass (of which the seeds with
their gradient isolation and blend, and of those the blend alone), the loss, the backward pass, clipping, the
optimizers' steps, and the rest of the step (clearing gradients, accumulating loss and accuracy, slicing the
batches). The split times the calls themselves (a wrapper around each, a microsecond a call): on a CPU every kernel
runs inside its call, so it is where the time goes; on a GPU it is the time to issue the kernels, not to run them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import esper_ray.env.epoch as epoch_module
import esper_ray.morpho.slot as slot_module
from esper_ray.contracts.env_config import AMP_MODES
from esper_ray.data.sharding import DeviceShard
from esper_ray.env import MorphogeneticEnv
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.slot import SeedSlot
from esper_ray.policy.heuristic import HeuristicController
from throughput import commit  # benchmarks/ is on sys.path when this runs as a script

# The train phase's parts: what each times. "seeds" (their modules, gradient isolation and blend) is part of
# "forward", "blend" part of "seeds"; "rest" is the train phase less the top-level parts (clearing gradients,
# accumulating loss and accuracy, slicing the batches).
TRAIN_PARTS: dict[str, tuple[tuple[Any, str], ...]] = {
    "data": ((DeviceShard, "epoch"),),
    "forward": ((MorphogeneticModel, "forward"),),
    "seeds": ((SeedSlot, "forward"),),
    "blend": ((slot_module, "blend"),),
    "loss": ((torch.nn.functional, "cross_entropy"),),
    "backward": ((torch.Tensor, "backward"),),
    "clip": ((torch.nn.utils, "clip_grad_norm_"),),
    "optimizer": ((torch.optim.SGD, "step"),),
}
WITHIN = {"seeds": "forward", "blend": "seeds"}


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {gpu}, "
            f"commit {commit()}")


def time_train_parts(seconds: dict[str, float]) -> None:
    """Wrap each call of TRAIN_PARTS so that its calls in training (autograd on) add their seconds to `seconds`."""
    for label, targets in TRAIN_PARTS.items():
        for owner, name in targets:
            inner: Callable[..., Any] = getattr(owner, name)

            def timed(*args: Any, _inner: Callable[..., Any] = inner, _label: str = label, **kwargs: Any) -> Any:
                if not torch.is_grad_enabled():  # the validation pass calls some of them too
                    return _inner(*args, **kwargs)
                start = time.perf_counter()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    seconds[_label] = seconds.get(_label, 0.0) + time.perf_counter() - start

            setattr(owner, name, functools.wraps(inner)(timed))


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
    parts: dict[str, float] = {}
    time_train_parts(parts)
    env = MorphogeneticEnv({"task": args.task, "max_epochs": args.steps, "device": args.device,
                            "num_shards": args.num_shards, "batch_size": args.batch_size, "amp": args.amp})
    controller = HeuristicController(env.slot_ids, args.steps)
    obs, _ = env.reset(seed=0)
    parts.clear()  # the reset's own validation is no step's
    phases: dict[str, list[float]] = {}
    steps = 0
    start = time.perf_counter()
    for _ in range(args.steps):
        obs, _, terminated, truncated, info = env.step(controller.act(obs))
        steps += 1
        for key, value in info.items():
            if key.startswith("time/"):
                phases.setdefault(key[5:], []).append(value)
        if terminated or truncated:
            break
    wall = (time.perf_counter() - start) / args.steps
    means = {k: statistics.fmean(v) for k, v in phases.items()}
    train_parts = {k: v / steps for k, v in parts.items()}
    train_parts["rest"] = means["train"] - sum(v for k, v in train_parts.items() if k not in WITHIN)
    samples = len(env.shard)
    if args.json:
        print(json.dumps({"machine": machine(), "task": args.task, "step_s": wall, "phases_s": means,
                          "train_parts_s": train_parts, "shard_samples": samples}))
        return
    print(f"machine: {machine()}")
    print(f"task {args.task}, shard of {samples} training samples, batch {env.cfg.effective_batch_size}, "
          f"amp {args.amp}, {args.steps} steps on {env.device}")
    print(f"seconds per env step: {wall:.4f}  ({samples / means['train']:,.0f} training samples/s in the train phase)")
    for name, value in means.items():
        print(f"  {name:<12}{value:.4f} s  ({100 * value / wall:.1f} %)")
    print("the train phase, per step:")
    for label in (*TRAIN_PARTS, "rest"):
        if label in train_parts:
            depth, outer = 0, label
            while outer in WITHIN:
                depth, outer = depth + 1, WITHIN[outer]
            name = "  " * depth + label
            print(f"  {name:<14}{train_parts[label]:.4f} s  ({100 * train_parts[label] / means['train']:.1f} % of train)")


if __name__ == "__main__":
    main()
