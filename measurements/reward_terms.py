"""What each reward mode pays for a seed's lifecycle: per-term returns of the same seed fossilized or kept on
probation to the end of the run, and what a FOSSILIZE is worth to the policy.

Issue 30 asked to measure before changing the reward. Two controllers plant the same seed at the first step
(the `fixed` arm's, conv_heavy in r0c1 on digits-impaired by default) and differ in one decision only:
`fossilize` keeps it at the first legal epoch (FixedSeedController), `probation` never fossilizes it (WAIT from
HOLDING on). Each runs the same episodes (host init, data order, seed init), and the script prints, per reward
mode, the mean return of each component and its discounted (gamma) total, and the committed and probationary
final accuracy. A positive `fossilize - probation` is what the mode pays the policy for committing.

    python measurements/reward_terms.py --episodes 4 --modes shaped committed
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esper_ray.contracts.actions import parse_blueprint, topology_blueprints  # noqa: E402
from esper_ray.contracts.controllers import FixedSeed  # noqa: E402
from esper_ray.contracts.rewards import RewardMode  # noqa: E402
from esper_ray.contracts.stages import Stage  # noqa: E402
from esper_ray.env.morphogenetic_env import MorphogeneticEnv  # noqa: E402
from esper_ray.env.observation import SLOT_FEATURES, decode_stage, slot_offset  # noqa: E402
from esper_ray.morpho.hosts import topology_of  # noqa: E402
from esper_ray.policy.baselines import wait_action  # noqa: E402
from esper_ray.policy.fixed import FixedSeedController  # noqa: E402


class ProbationController(FixedSeedController):
    """The fixed arm's seed and lifecycle, but never FOSSILIZE: the seed stays on probation to the end."""

    def act(self, obs):  # type: ignore[no-untyped-def]
        block = obs["features"][slot_offset(self.index) : slot_offset(self.index) + SLOT_FEATURES]
        if decode_stage(block) is Stage.HOLDING:
            return wait_action()
        return super().act(obs)


def run(mode: str, controller, episodes: int, args) -> dict[str, float]:  # type: ignore[no-untyped-def]
    env = MorphogeneticEnv(
        {
            "task": args.task,
            "max_epochs": args.max_epochs,
            "seed": args.seed,
            "reward_mode": mode,
            "slots": args.slots,
            "device": "cpu",
        }
    )
    gamma = env.reward_config.gamma
    terms: dict[str, list[float]] = collections.defaultdict(list)
    for episode in range(episodes):
        obs, _ = env.reset(seed=1000 + episode)
        controller.reset()
        sums: dict[str, float] = collections.defaultdict(float)
        t, done, info = 0, False, {}
        while not done:
            obs, reward, terminated, truncated, info = env.step(controller.act(obs))
            for k, v in info.items():
                if k.startswith("reward/"):
                    sums[k[7:]] += v
            sums["total"] += reward
            sums["discounted total"] += gamma**t * reward
            t += 1
            done = terminated or truncated
        sums["committed accuracy (pp)"] = 100 * info["committed_accuracy"]
        sums["probation accuracy (pp)"] = 100 * info["val_accuracy"]
        sums["fossilized"] = info["count/fossilized"]
        for k, v in sums.items():
            terms[k].append(v)
    return {k: float(np.mean(v)) for k, v in terms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits-impaired")
    parser.add_argument("--blueprint", default="conv_heavy")
    parser.add_argument("--slot", default="r0c1")
    parser.add_argument("--slots", nargs="+", default=["r0c0", "r0c1", "r0c2"])
    parser.add_argument("--max-epochs", type=int, default=25)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", default=[m.value for m in RewardMode])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    topology = topology_of(args.task)
    seed = FixedSeed(parse_blueprint(args.blueprint, topology_blueprints(topology), topology), args.slot)
    lifecycle_min_training = 10
    controllers = {
        "fossilize": FixedSeedController(args.slots, args.max_epochs, seed, lifecycle_min_training),
        "probation": ProbationController(args.slots, args.max_epochs, seed, lifecycle_min_training),
    }
    print(
        f"# {args.task}, {seed.label}, {args.episodes} episodes of {args.max_epochs} epochs, seed {args.seed}; "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    )
    figures = {}
    for mode in args.modes:
        results = {name: run(mode, c, args.episodes, args) for name, c in controllers.items()}
        figures[mode] = results
        keys = sorted(set(results["fossilize"]) | set(results["probation"]))
        print(f"\n## {mode}\n| term | fossilize | probation | fossilize - probation |\n|---|---|---|---|")
        for k in keys:
            a, b = results["fossilize"].get(k, 0.0), results["probation"].get(k, 0.0)
            print(f"| {k} | {a:+.2f} | {b:+.2f} | {a - b:+.2f} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
