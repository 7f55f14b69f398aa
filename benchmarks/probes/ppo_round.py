"""Where does a PPO round of controllers.yaml's training go, on this machine's CPUs? (issue 77)

    HOME=$(mktemp -d) python benchmarks/probes/ppo_round.py --envs-per-runner 1 --rounds 10

Trains tune_configs/controllers.yaml's `training` block (2 envs x 4 episodes of 25 epochs a round, the learner in the
trial's own process) for `--rounds` rounds on a local Ray, seed 0, into a temporary folder, with `--envs-per-runner`
envs a runner (1: two runners, what auto picks where the cores suffice; 2: one runner stepping both envs stacked).
Prints the machine, then one JSON line: medians over rounds 2 on of the round's wall (RLlib's time_this_iter_s) and of
its runners' sampling (esper's runner_sample_seconds), and RLlib's learner_update_timer and env_step_timer (moving
averages) at the end. Two runs at once, each on a Ray of its own, oversubscribe a 2-core machine 2x (as 8 trials of 4
processes do 16 cores):

    for h in a b; do HOME=$(mktemp -d) python benchmarks/probes/ppo_round.py --envs-per-runner 1 & done; wait

What it found (benchmarks/results/ppo_round_cpu_2026-12-07.jsonl, docs/performance.md): alone a round is its env
steps; two at once made the PPO update 5-9x slower while the algorithm's process ran torch at a thread a core (now its
CPUs' threads: algorithm_host.learner_threads); oversubscribed, the two envs stacked in one runner made rounds 1.35x
sooner, alone 1.5x later.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.commands.runner import run_training

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from stacked_hosts import machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs-per-runner", type=int, choices=(1, 2), default=1)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    training = yaml.safe_load((ROOT / "tune_configs" / "controllers.yaml").read_text())["training"]
    cfg = TrainConfig.from_mapping(
        {**training, "rounds": args.rounds, "seed": 0, "envs_per_runner": args.envs_per_runner}
    )
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        run_training(cfg, Path(folder) / "run", on_result=rounds.append, log=lambda _: None)
    later = rounds[1:]

    def median(values: list[float]) -> float:
        return round(float(statistics.median(values)), 3)

    print(json.dumps({"machine": machine()}), flush=True)
    figures = {
        "envs_per_runner": args.envs_per_runner,
        "rounds": len(rounds),
        "round_s_median_after_first": median([r["time_this_iter_s"] for r in later]),
        "runner_sample_s_median": median([r["env_runners"]["esper/runner_sample_seconds"] for r in later]),
        "learner_update_s": round(float(rounds[-1]["timers"]["learner_update_timer"]), 3),
        "env_step_s": round(float(rounds[-1]["env_runners"]["env_step_timer"]), 3),
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
