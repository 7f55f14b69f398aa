"""Seconds per MorphogeneticEnv step, split into phases, on the machine it runs on.

    python benchmarks/env_step.py --task digits --steps 40 [--device cuda] [--num-shards 1] [--plain]

Runs the heuristic controller (so seeds germinate, blend and get validated) and prints the mean seconds per
step of each phase: decision, train (one host epoch), val (fused counterfactual pass), lifecycle, reward,
observation; then the train phase's own split: drawing the epoch's data, the forward pass (of which the seeds with
their gradient isolation and blend, and of those the blend alone), the loss, the backward pass, clipping, the
optimizers' steps, and the rest of the step (clearing gradients, accumulating loss and accuracy, slicing the
batches). The split times the calls themselves (a wrapper around each, a microsecond a call): on a CPU every kernel
runs inside its call, so it is where the time goes; on a GPU it is the time to issue the kernels, not to run them.
`--plain` turns the CPU path of esper_ray/morpho/cpu_step.py off (what the step was before issue 67).

Side by side with other code (issue 67: on a shared machine only ratios measured alternately mean anything):

    git archive 4274434 | tar -x -C /tmp/esper_old
    OMP_NUM_THREADS=1 python benchmarks/env_step.py --task digits-impaired --num-shards 2 --steps 50 \
        --against /tmp/esper_old --label-against 4274434 --pairs 6 > benchmarks/results/env_step_cpu_DATE.jsonl

runs that tree's env_step.py and this one alternately (the order swapped every pair), each in a process of its own
with its own tree first on PYTHONPATH, and prints a JSON line per run, then one with the ratio of their seconds
per step (old / new, the median over pairs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from throughput import commit  # benchmarks/ is on sys.path when this runs as a script

import esper_ray.env.train_step as train_step_module
import esper_ray.morpho.slot as slot_module
from esper_ray.contracts.env_config import AMP_MODES
from esper_ray.data.sharding import DeviceShard
from esper_ray.env import MorphogeneticEnv
from esper_ray.morpho import cpu_step
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.slot import SeedSlot
from esper_ray.policy.heuristic import HeuristicController

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
    "clip": (
        (train_step_module, "clip_grad_norms"),
        (torch.nn.utils, "clip_grad_norm_"),
    ),  # the CPU path's, the plain one's
    "optimizer": ((torch.optim.SGD, "step"), (train_step_module, "sgd_step")),
}
WITHIN = {"seeds": "forward", "blend": "seeds"}


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {gpu}, "
        f"commit {commit()}"
    )


def cpu_model() -> str:
    try:
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or "unknown CPU"


def side_by_side(args: argparse.Namespace, forwarded: list[str]) -> None:
    """This tree's env_step.py and `args.against`'s, alternately, each `--json` in a process of its own."""
    trees = {"old": Path(args.against).resolve(), "new": Path(__file__).resolve().parents[1]}
    labels = {"old": args.label_against, "new": commit() or "this tree"}
    common = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "card": "no GPU" if args.device == "cpu" else args.device,
        "command": " ".join(sys.argv),
    }
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    for pair in range(1, args.pairs + 1):
        for code in ("old", "new") if pair % 2 else ("new", "old"):
            tree = trees[code]
            run = subprocess.run(
                [sys.executable, str(tree / "benchmarks" / "env_step.py"), *forwarded, "--json"],
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
                check=True,
            )
            record = json.loads(run.stdout.strip().splitlines()[-1])
            seconds[code].append(record["step_s"])
            print(json.dumps({**record, **common, "pair": pair, "code": labels[code], "tree": code}), flush=True)
    ratios = [old / new for old, new in zip(seconds["old"], seconds["new"])]
    print(
        json.dumps(
            {
                **common,
                "code": f"{labels['old']} (old) against {labels['new']} (new)",
                "old_over_new_per_pair": [round(r, 3) for r in ratios],
                "old_over_new_median": statistics.median(ratios),
                "old_step_s_median": statistics.median(seconds["old"]),
                "new_step_s_median": statistics.median(seconds["new"]),
            }
        )
    )


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
    parser.add_argument("--plain", action="store_true", help="the CPU step without esper_ray/morpho/cpu_step.py's path")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", metavar="TREE", help="another copy of the code to run alternately with this one")
    parser.add_argument("--label-against", default="old", help="what to call that code in the records (its commit)")
    parser.add_argument("--pairs", type=int, default=5, help="with --against: runs of each")
    args = parser.parse_args()
    if args.against:
        forwarded = [
            "--task",
            args.task,
            "--steps",
            str(args.steps),
            "--device",
            args.device,
            "--num-shards",
            str(args.num_shards),
            "--amp",
            args.amp,
        ] + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
        side_by_side(args, forwarded)
        return
    cpu_step.ENABLED = not args.plain
    parts: dict[str, float] = {}
    time_train_parts(parts)
    env = MorphogeneticEnv(
        {
            "task": args.task,
            "max_epochs": args.steps,
            "device": args.device,
            "num_shards": args.num_shards,
            "batch_size": args.batch_size,
            "amp": args.amp,
        }
    )
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
        print(
            json.dumps(
                {
                    "machine": machine(),
                    "task": args.task,
                    "plain": args.plain,
                    "step_s": wall,
                    "phases_s": means,
                    "train_parts_s": train_parts,
                    "shard_samples": samples,
                }
            )
        )
        return
    print(f"machine: {machine()}")
    print(
        f"task {args.task}, shard of {samples} training samples, batch {env.cfg.effective_batch_size}, "
        f"amp {args.amp}, {args.steps} steps on {env.device}{', plain CPU step' if args.plain else ''}"
    )
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
            print(
                f"  {name:<14}{train_parts[label]:.4f} s  ({100 * train_parts[label] / means['train']:.1f} % of train)"
            )


if __name__ == "__main__":
    main()
