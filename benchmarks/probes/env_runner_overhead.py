"""RLlib's own work per env step inside one env runner, without Ray's processes around it, on this machine.

    python benchmarks/probes/env_runner_overhead.py [--episodes 4] [--model gpu] [--replay-env]

Builds the env runner `esper-ray train` uses (the default train settings; env runner 1 of 2, so shard 0 of
2) in this process, with one torch thread as a runner has, and samples whole episodes from it. The env's
`step` is timed from inside, so the difference between a sample's time and the env steps' time is what RLlib
adds per step (connectors, policy inference, action sampling, episode bookkeeping, callbacks). With
--replay-env the env trains nothing: each step returns the outputs of one real step again (an episode still
ends after max_epochs steps), so the sample's time is RLlib's alone, without the env's noise on a shared
machine. `policy_forward_seconds_per_step` is the policy network's share (its forward pass reads the `gpu` preset's
12 MB of weights a step, which a real env step between two of them pushes out of the CPU's caches). Prints one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=4, help="episodes to time (after one of warm-up)")
    parser.add_argument("--model", default="cpu", help="the policy's size preset: cpu (default) or gpu (512 units)")
    parser.add_argument("--replay-env", action="store_true", help="steps replay one real step's outputs (see above)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.env.morphogenetic_env import MorphogeneticEnv
    from esper_ray.train.rllib.env_runner import CpuPolicyEnvRunner
    from esper_ray.train.rllib.ppo_config import build_ppo_config

    cfg = TrainConfig(model=args.model)
    runner = CpuPolicyEnvRunner(config=build_ppo_config(cfg), worker_index=1, num_workers=cfg.envs)
    runner.sample(num_episodes=1)  # warm-up
    env_seconds, env_steps = 0.0, 0
    original_step = MorphogeneticEnv.step

    replayed: list = []

    def replay_step(self, action):  # type: ignore[no-untyped-def]
        if not replayed:
            replayed.extend(original_step(self, action))
        obs, reward, _, truncated, info = replayed
        return obs, reward, (env_steps + 1) % cfg.max_epochs == 0, truncated, info

    def timed_step(self, action):  # type: ignore[no-untyped-def]
        nonlocal env_seconds, env_steps
        start = time.perf_counter()
        try:
            return (replay_step if args.replay_env else original_step)(self, action)
        finally:
            env_seconds += time.perf_counter() - start
            env_steps += 1

    forward_seconds, act = 0.0, runner.module.forward_exploration

    def timed_forward(batch, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal forward_seconds
        start = time.perf_counter()
        try:
            return act(batch, **kwargs)
        finally:
            forward_seconds += time.perf_counter() - start

    runner.module.forward_exploration = timed_forward  # type: ignore[method-assign]
    MorphogeneticEnv.step = timed_step  # type: ignore[method-assign]
    start = time.perf_counter()
    runner.sample(num_episodes=args.episodes)
    sample_seconds = time.perf_counter() - start
    MorphogeneticEnv.step = original_step  # type: ignore[method-assign]
    print(
        json.dumps(
            {
                "machine": {"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__},
                "model": args.model,
                "replay_env": args.replay_env,
                "env_steps": env_steps,
                "sample_seconds_per_step": round(sample_seconds / env_steps, 5),
                "env_seconds_per_step": round(env_seconds / env_steps, 5),
                "rllib_seconds_per_step": round((sample_seconds - env_seconds) / env_steps, 5),
                "policy_forward_seconds_per_step": round(forward_seconds / env_steps, 5),
            }
        )
    )


if __name__ == "__main__":
    main()
