"""Where does a stacked CPU env step's time go, by torch operator? (issue 77)

    OMP_NUM_THREADS=1 python benchmarks/probes/vector_env_ops.py [--envs 16] [--steps 5] [--top 12]

Builds benchmarks/vector_env.py's vector env of `--envs` digits-impaired envs with a HeuristicController each (the
seeded case: its 3x3 seeds at r0c0 train stacked), on one torch thread, steps it twice to warm up, then profiles
`--steps` steps with torch.profiler. Prints the machine, the `--top` operators by self CPU time, then one JSON line:
the step's milliseconds per host and each of those operators' share of the profiled self CPU time. What it found
(docs/design.md, cut 7): the seeds' convolutions, the training pool and batch norm lead, and no operator is a third of
the step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stacked_hosts import machine  # noqa: E402  (sibling scripts, not a package)
from vector_env import vector_variant  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    step, vector = vector_variant(args.envs, args.steps, max_epochs=4 * args.steps, heuristic=True)
    step(), step()  # warm-up: oneDNN's primitives, the allocator, the first stacks
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        began = time.perf_counter()
        step()
        seconds = time.perf_counter() - began
    vector.close()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    print(json.dumps({"machine": machine()}), flush=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top), flush=True)
    figures = {
        "envs": args.envs,
        "steps": args.steps,
        "ms_per_host_step_profiled": round(1000 * seconds / (args.envs * args.steps), 3),
        "self_cpu_share": {e.key: round(e.self_cpu_time_total / total, 3) for e in ops[: args.top]},
        "calls_per_host_step": {e.key: round(e.count / (args.envs * args.steps), 1) for e in ops[: args.top]},
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
