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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stacked_hosts import machine  # noqa: E402

from esper_ray.env import MorphogeneticEnv  # noqa: E402
from esper_ray.env.vector_env import VectorMorphogeneticEnv  # noqa: E402
from esper_ray.policy.baselines import wait_action  # noqa: E402
from esper_ray.policy.heuristic import HeuristicController  # noqa: E402

TASK = "digits-impaired"


def configs(n: int, max_epochs: int) -> list[dict[str, Any]]:
    return [
        {"task": TASK, "device": "cpu", "seed": 0, "shard": i % 2, "num_shards": 2, "max_epochs": max_epochs}
        for i in range(n)
    ]


def actors(envs: list[MorphogeneticEnv], max_epochs: int, heuristic: bool) -> list[Callable[[Any], np.ndarray]]:
    """One policy per env: WAIT always, or that env's own HeuristicController."""
    if not heuristic:
        return [lambda obs: wait_action() for _ in envs]
    controllers = [HeuristicController(env.slot_ids, max_epochs) for env in envs]
    for controller in controllers:
        controller.reset()
    return [controller.act for controller in controllers]


def measure(n: int, steps: int, rounds: int, heuristic: bool) -> dict[str, Any]:
    """Per-host seconds of an env step of each variant for N envs (the median over rounds), and the seeded steps."""
    max_epochs = (rounds + 1) * steps + 1  # no episode ends inside the run
    separate = [MorphogeneticEnv(c) for c in configs(n, max_epochs)]
    separate_obs = [env.reset(seed=i)[0] for i, env in enumerate(separate)]
    separate_act = actors(separate, max_epochs, heuristic)
    vector = VectorMorphogeneticEnv.of_configs(configs(n, max_epochs))
    vector_obs, _ = vector.reset(seed=0)  # env i from seed i, as the separate envs
    vector_act = actors(vector.envs, max_epochs, heuristic)  # type: ignore[arg-type]

    def step_separate() -> None:
        for _ in range(steps):
            for i, env in enumerate(separate):
                separate_obs[i] = env.step(separate_act[i](separate_obs[i]))[0]

    def step_vector() -> None:
        nonlocal vector_obs
        for _ in range(steps):
            obs = list(iterate(vector.single_observation_space, vector_obs))
            vector_obs = vector.step(np.stack([act(o) for act, o in zip(vector_act, obs, strict=True)]))[0]

    variants = {"separate": step_separate, "vector": step_vector}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds + 1):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            start = time.perf_counter()
            variants[name]()
            if r > 0:  # round 0 warms up (allocator, oneDNN's primitives)
                seconds[name].append(time.perf_counter() - start)
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
    args = parser.parse_args()
    torch.set_num_threads(1)
    where = machine()
    print(json.dumps({"machine": where}), flush=True)
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
                    "cpu": where["cpu"],
                    "cores": where["cores"],
                    "torch": where["torch"],
                    "commit": where["commit"],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
