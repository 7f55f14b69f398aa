"""CUDA graphs on a GPU: the same episode with and without captured train steps, and their speed.

    python benchmarks/graph_check.py            # needs CUDA

1. Correctness: one env, the same seed and actions (a seed germinated at epoch 1, so the graph is re-captured
   as the model grows), eager vs captured: the per-epoch train and validation losses must agree within float
   tolerance (the same kernels on the same data; only launch order bookkeeping differs).
2. Speed: host train samples/s of one env on CIFAR-shaped data (50,000 samples, batch 512), eager vs captured,
   fp32 and bf16. Prints a table and one JSON line.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from throughput import commit  # benchmarks/ is on sys.path when this runs as a script

from esper_ray.contracts.actions import Blueprint, Op, encode_joint
from esper_ray.env import MorphogeneticEnv
from esper_ray.policy.baselines import wait_action

# Graph and eager run the same kernels, but cuDNN's fast backward is not deterministic, so per-epoch losses may
# drift apart by float noise; the eager-vs-eager difference is printed beside it to show that noise's size.
TOLERANCE = 2e-3


def episode(cuda_graphs: bool, epochs: int = 8) -> list[float]:
    env = MorphogeneticEnv(
        {
            "task": "synthetic",
            "synthetic_size": 8_000,
            "batch_size": 256,
            "slots": ["r0c1"],
            "max_epochs": epochs,
            "device": "cuda",
            "cuda_graphs": cuda_graphs,
        }
    )
    env.reset(seed=11)
    losses = []
    for epoch in range(epochs):
        action = wait_action()
        if epoch == 1:
            action[0], action[1] = encode_joint(Op.GERMINATE, 0), int(Blueprint.CONV_LIGHT)
        _, _, _, _, info = env.step(action)
        losses += [info["train_loss"], info["val_loss"]]
    return losses


def samples_per_second(cuda_graphs: bool, amp: str, epochs: int = 6) -> float:
    env = MorphogeneticEnv(
        {
            "task": "synthetic",
            "synthetic_size": 50_000,
            "batch_size": 512,
            "slots": ["r0c1"],
            "max_epochs": epochs + 2,
            "device": "cuda",
            "cuda_graphs": cuda_graphs,
            "amp": amp,
        }
    )
    env.reset(seed=0)
    for _ in range(2):  # warm-up (and the first capture)
        env.step(wait_action())
    seconds, samples = 0.0, 0
    for _ in range(epochs):
        _, _, _, _, info = env.step(wait_action())
        seconds, samples = seconds + info["time/train"], samples + info["train_total"]
    return samples / seconds


def main() -> int:
    if not torch.cuda.is_available():
        print("graph_check: no CUDA device here", file=sys.stderr)
        return 2
    eager, again, captured = np.array(episode(False)), np.array(episode(False)), np.array(episode(True))
    worst = float(np.max(np.abs(eager - captured) / np.maximum(np.abs(eager), 1e-12)))
    spread = float(np.max(np.abs(eager - again) / np.maximum(np.abs(eager), 1e-12)))
    print(f"eager against eager (the same run twice): worst relative difference {spread:.2e}")
    rates = {
        f"{amp}_{'graph' if g else 'eager'}": round(samples_per_second(g, amp))
        for amp in ("off", "bf16")
        for g in (False, True)
    }
    print(
        f"card {torch.cuda.get_device_name(0)}, commit {commit()}; worst relative difference of per-epoch losses, "
        f"graph vs eager: {worst:.2e}"
    )
    for name, rate in rates.items():
        print(f"  one env, train phase, {name:>10}: {rate:>9,} samples/s")
    print(
        json.dumps(
            {
                "card": torch.cuda.get_device_name(0),
                "commit": commit(),
                "max_relative_loss_difference": worst,
                "eager_rerun_difference": spread,
                "samples_per_s": rates,
                "within_tolerance": worst <= TOLERANCE,
            }
        )
    )
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
