"""Per-host seconds of a digits-impaired env step: N envs in one VectorMorphogeneticEnv (issue 77) against the same N
MorphogeneticEnvs stepped one after another, on one CPU thread.

    OMP_NUM_THREADS=1 python benchmarks/vector_env.py [--sizes 1 4 16] [--steps 5] [--rounds 5] [--heuristic]

Env i of N runs on shard i % 2 of 2 (the CNN A/Bs' setting: a 540- or 539-sample shard whatever N, so a host's work
is the same at every N) from reset seed i, on the CPU, in episodes longer than the run (no reset is timed). By default
every env only waits, so no slot holds a seed and the vector env trains all N hosts as one stacked module: the case
it is built for. `--heuristic` lets a HeuristicController per env plant, blend and fossilize seeds, which train
stacked too (one stacked seed per slot, blueprint, blend and stage kind: morpho/stacked_seeds.py), so this is nearer
what a run's envs do.

A step is the whole env step (the host epoch, validation, counterfactuals, lifecycle, reward, observation), the
vector env's including its stacking and the copies back. The two variants run alternately, in a swapped order every
round, `--rounds` times of `--steps` steps each after one warm-up round; a figure is the median over rounds of a
step's seconds divided by N. Prints the machine (CPU, cores, torch, commit), then one JSON line per N with
`separate_over_vector`, measured in the same rounds. About a minute on one idle core at the defaults.

Against other code (issue 77's goal: 4x the per-host env step of 0b62e59):

    git archive 0b62e59 | tar -x -C /tmp/old
    OMP_NUM_THREADS=1 python benchmarks/vector_env.py --against /tmp/old --sizes 16 --heuristic --pairs 5

runs, in each of `--pairs` pairs, three processes in a rotated order: that tree's separate envs (its esper_ray first on
PYTHONPATH), this tree's separate envs and this tree's vector env, each timing `--rounds` rounds after a warm-up; prints
one JSON line per process and per N one with the medians over pairs, and `old_over_vector`, `old_over_separate`: the
medians over pairs of the ratios within each pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector.utils import iterate

# esper_ray is imported inside the functions: a child process of --against imports another tree's, which has only
# MorphogeneticEnv, wait_action and HeuristicController of what this script uses.

TASK = "digits-impaired"


def configs(n: int, max_epochs: int) -> list[dict[str, Any]]:
    return [
        {"task": TASK, "device": "cpu", "seed": 0, "shard": i % 2, "num_shards": 2, "max_epochs": max_epochs}
        for i in range(n)
    ]


def actors(envs: list[Any], max_epochs: int, heuristic: bool) -> list[Callable[[Any], np.ndarray]]:
    """One policy per env: WAIT always, or that env's own HeuristicController."""
    from esper_ray.policy.baselines import wait_action
    from esper_ray.policy.heuristic import HeuristicController

    if not heuristic:
        return [lambda obs: wait_action() for _ in envs]
    controllers = [HeuristicController(env.slot_ids, max_epochs) for env in envs]
    for controller in controllers:
        controller.reset()
    return [controller.act for controller in controllers]


def separate_variant(n: int, steps: int, max_epochs: int, heuristic: bool) -> Callable[[], None]:
    """`steps` steps of N MorphogeneticEnvs, one after another."""
    from esper_ray.env import MorphogeneticEnv

    separate = [MorphogeneticEnv(c) for c in configs(n, max_epochs)]
    separate_obs = [env.reset(seed=i)[0] for i, env in enumerate(separate)]
    separate_act = actors(separate, max_epochs, heuristic)

    def step_separate() -> None:
        for _ in range(steps):
            for i, env in enumerate(separate):
                separate_obs[i] = env.step(separate_act[i](separate_obs[i]))[0]

    return step_separate


def vector_variant(n: int, steps: int, max_epochs: int, heuristic: bool) -> tuple[Callable[[], None], Any]:
    """`steps` steps of N envs as one VectorMorphogeneticEnv, and the vector env."""
    from esper_ray.env.vector_env import VectorMorphogeneticEnv

    vector = VectorMorphogeneticEnv.of_configs(configs(n, max_epochs))
    vector_obs, _ = vector.reset(seed=0)  # env i from seed i, as the separate envs
    vector_act = actors(vector.envs, max_epochs, heuristic)  # type: ignore[arg-type]

    def step_vector() -> None:
        nonlocal vector_obs
        for _ in range(steps):
            obs = list(iterate(vector.single_observation_space, vector_obs))
            vector_obs = vector.step(np.stack([act(o) for act, o in zip(vector_act, obs, strict=True)]))[0]

    return step_vector, vector


def timed_rounds(variants: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Each variant's seconds in each of `rounds` rounds after a warm-up round, alternating, the order swapped every
    round."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds + 1):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            start = time.perf_counter()
            variants[name]()
            if r > 0:  # round 0 warms up (allocator, oneDNN's primitives)
                seconds[name].append(time.perf_counter() - start)
    return seconds


def measure(n: int, steps: int, rounds: int, heuristic: bool) -> dict[str, Any]:
    """Per-host seconds of an env step of each variant for N envs (the median over rounds), and the seeded steps."""
    max_epochs = (rounds + 1) * steps + 1  # no episode ends inside the run
    step_vector, vector = vector_variant(n, steps, max_epochs, heuristic)
    step_separate = separate_variant(n, steps, max_epochs, heuristic)
    seconds = timed_rounds({"separate": step_separate, "vector": step_vector}, rounds)
    vector.close()
    return {
        "per_host_step_ms": {k: round(1000 * statistics.median(v) / (n * steps), 3) for k, v in seconds.items()},
        "separate_over_vector": round(statistics.median(seconds["separate"]) / statistics.median(seconds["vector"]), 2),
        "stacked_epoch_share": round(sum(vector.stacked_epochs) / max(sum(e.epoch for e in vector.envs), 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=5, help="env steps a round, per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--heuristic", action="store_true", help="a HeuristicController per env instead of WAIT")
    parser.add_argument("--against", type=Path, metavar="TREE", help="another tree's separate envs (module doc)")
    parser.add_argument("--pairs", type=int, default=5, help="with --against: rotations of the three processes")
    parser.add_argument("--child", choices=("separate", "vector"), help=argparse.SUPPRESS)  # one --against process
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        max_epochs = (args.rounds + 1) * args.steps + 1
        n = args.sizes[0]
        if args.child == "separate":
            run = separate_variant(n, args.steps, max_epochs, args.heuristic)
        else:
            run = vector_variant(n, args.steps, max_epochs, args.heuristic)[0]
        seconds = timed_rounds({args.child: run}, args.rounds)[args.child]
        print(json.dumps({"per_host_step_ms": round(1000 * statistics.median(seconds) / (n * args.steps), 3)}))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from stacked_hosts import machine

    where = machine()
    print(json.dumps({"machine": where}), flush=True)
    if args.against:
        for n in args.sizes:
            print(json.dumps(against(args, n, where)), flush=True)
        return
    for n in args.sizes:
        figures = measure(n, args.steps, args.rounds, args.heuristic)
        print(
            json.dumps(
                {
                    "envs": n,
                    **figures,
                    "task": TASK,
                    "controller": "heuristic" if args.heuristic else "wait",
                    "steps": args.steps,
                    "rounds": args.rounds,
                    "card": where["card"],
                    "cpu": where["cpu"],
                    "cores": where["cores"],
                    "torch": where["torch"],
                    "commit": where["commit"],
                }
            ),
            flush=True,
        )


def against(args: argparse.Namespace, n: int, where: dict[str, Any]) -> dict[str, Any]:
    """The --against figures for N envs: per pair, the three processes in a rotated order, each its own warm-up and
    rounds; the medians over pairs of their per-host milliseconds."""
    import os
    import subprocess

    here = Path(__file__).resolve().parent.parent
    runs = [("old_separate", args.against, "separate"), ("separate", here, "separate"), ("vector", here, "vector")]
    figures: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for pair in range(args.pairs):
        for name, tree, child in runs[pair % 3 :] + runs[: pair % 3]:
            command = [sys.executable, __file__, "--child", child, "--sizes", str(n), "--steps", str(args.steps)]
            command += ["--rounds", str(args.rounds)] + (["--heuristic"] if args.heuristic else [])
            env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=tree).stdout
            figures[name].append(json.loads(out.strip().splitlines()[-1])["per_host_step_ms"])
            print(json.dumps({"envs": n, "pair": pair, "run": name, "per_host_step_ms": figures[name][-1]}), flush=True)
    median = {name: statistics.median(v) for name, v in figures.items()}

    def ratio(a: str, b: str) -> float:  # the median over pairs of the ratio within each pair: a noisy pair cancels
        return round(statistics.median(x / y for x, y in zip(figures[a], figures[b], strict=True)), 2)

    return {
        "envs": n,
        "per_host_step_ms": median,
        "old_over_vector": ratio("old_separate", "vector"),
        "old_over_separate": ratio("old_separate", "separate"),
        "separate_over_vector": ratio("separate", "vector"),
        "against": str(args.against),
        "controller": "heuristic" if args.heuristic else "wait",
        "pairs": args.pairs,
        **{k: where[k] for k in ("card", "cpu", "cores", "torch", "commit")},
    }


if __name__ == "__main__":
    main()
