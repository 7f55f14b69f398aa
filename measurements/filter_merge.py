"""The observation filter's merged statistics, round by round, with Ray 2.60's merge and with esper-ray's.

Emulates what RLlib does every round with the env runners' env-to-module filters: each runner is sent the merged
statistics (set_state), pushes its round's features, and the driver merges the runners' states (merge_states).
The features are drawn from one fixed normal distribution, so the right merged mean and std stay at --mean and
--std. Prints one line a round and a JSON line at the end.

    python measurements/filter_merge.py --rounds 8 --runners 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esper_ray.policy.feature_filter import FEATURES, FeatureLayout, FeatureMeanStdFilter  # noqa: E402


def make_filter() -> FeatureMeanStdFilter:
    # one base feature, no slots (the pooled slot statistics sized like it, so that Ray's own merge takes the state)
    feature_filter = FeatureMeanStdFilter(
        clip_by_value=1e6, layout=FeatureLayout(base=1, slots=0, block=1, measured=1, present=0)
    )
    feature_filter.input_observation_space = gym.spaces.Dict(
        {FEATURES: gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), "action_mask": gym.spaces.MultiBinary(2)}
    )
    return feature_filter


def merged_by_round(
    stock: bool, rounds: int, runners: int, steps: int, mean: float, std: float, seed: int
) -> list[tuple[int, float, float]]:
    """(count, mean, std) of the driver's statistics after each round; `stock`: RLlib's own merge_states."""
    rng = np.random.default_rng(seed)
    driver, workers = make_filter(), [make_filter() for _ in range(runners)]
    merge = (lambda states: MeanStdFilter.merge_states(driver, states)) if stock else driver.merge_states
    merged, out = driver.get_state(), []
    for _ in range(rounds):
        for worker in workers:
            worker.set_state(merged)
            for x in rng.normal(mean, std, size=(steps, 1)).astype(np.float32):
                worker.normalize(x, update=True)
        merged = merge([worker.get_state() for worker in workers])
        running = driver._filters[None].running_stats
        out.append((int(running.n), float(running.mean[0]), float(running.std[0])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="features each runner pushes a round")
    parser.add_argument("--mean", type=float, default=5.0)
    parser.add_argument("--std", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    common = dict(
        rounds=args.rounds, runners=args.runners, steps=args.steps, mean=args.mean, std=args.std, seed=args.seed
    )
    stock, ours = merged_by_round(True, **common), merged_by_round(False, **common)
    print(f"data: mean {args.mean}, std {args.std}; {args.runners} runners x {args.steps} features a round")
    for r, ((n, m1, s1), (_, m2, s2)) in enumerate(zip(stock, ours), 1):
        print(
            f"round {r}: n {n}; Ray 2.60's merge: mean {m1:.3f} std {s1:.3f}; esper-ray's: mean {m2:.3f} std {s2:.3f}"
        )
    print(json.dumps({"setup": vars(args), "ray_merge": stock, "esper_ray_merge": ours}))


if __name__ == "__main__":
    main()
