"""What an env's CUDA-graph captures cost: the wall of capturing steps against plain ones, and where it goes.

    python benchmarks/probes/capture_costs.py            # 4 env processes under private MPS (throughput.py's bare half)
    python benchmarks/probes/capture_costs.py --procs 1 --no-mps
    python benchmarks/probes/capture_costs.py --profile-eager 3   # and where 3 eager warm-up steps spend their CPU time

Each process steps one env of `benchmarks/throughput.py --gpu` (random controller) for `--seconds` after an episode of
warm-up. A step whose structure changed (episode start, a germination, a stage that changes the step's code, a prune)
trains its first batches eagerly (train_step.WARMUP_STEPS), captures a new train graph, and validates eagerly once
before capturing a new validation graph (validation_graph.WARMUP_PASSES); an epoch's last batch has graphs of its own,
warmed up the same way. Timed around each: the captures themselves (CapturedStep / CapturedValidation construction,
wall), the eager train steps of full batches (their CPU side) and of last batches (`eager_last_batch`, CPU side), the
eager validation passes (synchronised), and every env step, split into steps that captured something and plain ones.
Prints one JSON line with per-episode and per-step figures averaged over the processes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for throughput.py
from throughput import (
    Setup,
    _show_one_gpu,
    bare_mps,
    graph_captures,
    machine,
    run_processes,  # noqa: E402
    warmed_up_env,
)


def _timed(owner: Any, name: str, totals: dict[str, float], key: str, sync: bool = False, when: Any = None) -> None:
    """Wrap owner.name so that its wall time is added to totals[key] (and a count to totals[key + '_n'])."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when is not None and not when(*args, **kwargs):
            return original(*args, **kwargs)
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        if sync:
            torch.cuda.synchronize()
        totals[key] += time.perf_counter() - t0
        totals[key + "_n"] += 1
        return out

    setattr(owner, name, wrapper)


def _is_warm_up(self: Any, x: Any, y: Any, on_grads: Any = None, capturing: bool = False, fuse: bool = True) -> bool:
    """A TrainStep call that is an eager step of a full batch before a capture (not captured, fusing asked)."""
    return not capturing and fuse


def _is_last_batch(self: Any, x: Any, y: Any, on_grads: Any = None, capturing: bool = False, fuse: bool = True) -> bool:
    """An eager TrainStep call for an epoch's last batch (unfused, with gradient telemetry): a warm-up before its
    capture, or every epoch where graphs are off."""
    return not capturing and not fuse


def _profiled(owner: Any, name: str, calls: list[int], when: Any) -> None:
    """Wrap owner.name so that its first calls[0] calls that pass `when` run under torch.profiler; each prints its
    wall and the ops with the most CPU time, self and total, to stderr."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if calls[0] <= 0 or not when(*args, **kwargs):
            return original(*args, **kwargs)
        calls[0] -= 1
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        t0 = time.perf_counter()
        with torch.profiler.profile(activities=activities) as profile:
            out = original(*args, **kwargs)
        wall = time.perf_counter() - t0
        table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        print(
            f"--- an eager warm-up step: {1e3 * wall:.1f} ms of wall (profiled)\n{table}", file=sys.stderr, flush=True
        )
        return out

    setattr(owner, name, wrapper)


def _worker(setup: Setup, shard: int, seconds: float, profile_eager: int, barrier: Any, results: Any) -> None:
    _show_one_gpu(setup, shard)
    torch.set_num_threads(1)
    from esper_ray.env import train_step, validation_graph

    totals: dict[str, float] = defaultdict(float)
    _timed(train_step.CapturedStep, "__init__", totals, "capture_train")
    _timed(validation_graph.CapturedValidation, "__init__", totals, "capture_val")
    _timed(train_step.TrainStep, "__call__", totals, "eager_train", when=_is_warm_up)
    _timed(train_step.TrainStep, "__call__", totals, "eager_last_batch", when=_is_last_batch)
    to_profile = [0]  # set after the warm-up episode, in the first process only
    _profiled(train_step.TrainStep, "__call__", to_profile, when=_is_warm_up)
    _timed(validation_graph, "validate_fused", totals, "eager_val", sync=True)

    env, controller, obs = warmed_up_env(setup, shard)
    totals.clear()
    to_profile[0] = profile_eager if shard == 0 else 0
    barrier.wait()
    start, episodes, plain, capturing = time.perf_counter(), 0, [], []
    while time.perf_counter() - start < seconds:
        before, t0 = graph_captures(env), time.perf_counter()
        obs, _, terminated, _, _ = env.step(controller.act(obs))
        (capturing if graph_captures(env) > before else plain).append(time.perf_counter() - t0)
        if terminated:
            t0 = time.perf_counter()
            obs, _ = env.reset()
            totals["reset"] += time.perf_counter() - t0
            episodes += 1
    wall = time.perf_counter() - start
    results.put(
        {
            "wall": wall,
            "episodes": episodes,
            "plain_steps": len(plain),
            "capturing_steps": len(capturing),
            "ms_plain_step": 1e3 * sum(plain) / max(len(plain), 1),
            "ms_capturing_step": 1e3 * sum(capturing) / max(len(capturing), 1),
            "capturing_share": sum(capturing) / wall,
            **dict(totals),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--no-mps", action="store_true")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="an env setting (repeatable)")
    parser.add_argument(
        "--profile-eager",
        type=int,
        default=0,
        metavar="N",
        help="profile the first N eager warm-up steps of the first process (ops by CPU time, to stderr; "
        "its eager_train figures then include the profiler's own time)",
    )
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    from esper_ray.cli import parse_env_overrides

    setup = Setup(
        envs=args.procs,
        gpus=1,
        task="synthetic",
        train_size=12_500 * args.procs,
        val_size=10_000,
        batch_size=512,
        max_epochs=20,
        episodes_per_env=4,
        rounds=1,
        bare_seconds=args.seconds,
        slots=("r0c1",),
        model="gpu",
        extra_env=tuple(sorted(parse_env_overrides(args.env).items())),
    )
    with bare_mps(not args.no_mps):
        outcomes = run_processes(_worker, args.procs, lambda k: (setup, k, args.seconds, args.profile_eager))
    keys = {k for o in outcomes for k in o}  # a process that, say, validated no pass eagerly has no eager_val
    mean = {k: sum(o.get(k, 0.0) for o in outcomes) / len(outcomes) for k in keys}
    episodes = max(mean["episodes"], 1e-9)
    per_episode = {
        k: round(1e3 * mean[k] / episodes, 1)
        for k in ("capture_train", "capture_val", "eager_train", "eager_val", "eager_last_batch", "reset")
        if k in mean
    }
    counts = {k[:-2]: round(mean[k] / episodes, 2) for k in mean if k.endswith("_n")}
    report = {
        "note": args.note,
        "machine": machine(),
        "procs": args.procs,
        "mps": not args.no_mps,
        "env": dict(setup.extra_env),
        "episodes_per_proc": mean["episodes"],
        "ms_plain_step": round(mean["ms_plain_step"], 2),
        "ms_capturing_step": round(mean["ms_capturing_step"], 2),
        "capturing_steps_per_episode": round(mean["capturing_steps"] / episodes, 2),
        "capturing_share_of_wall": round(mean["capturing_share"], 3),
        "ms_per_episode": per_episode,
        "calls_per_episode": counts,
        "samples_per_s": round(setup.train_size * (mean["plain_steps"] + mean["capturing_steps"]) / mean["wall"]),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
