"""What each seed is worth at the end of a host run, and how much of that a single episode shows: the committed
model's final accuracy and the `committed` reward's return for every blueprint planted at epoch 0 in one slot and
fossilized at the first legal epoch (and for the best one in the other slots, planted later, or left on
probation), paired with the bare host on the same episodes (same host initialisation and data order). Last, the
headroom of a controller that adapts to each episode: the best plan for every episode (an oracle) against the
best plan for all of them, which is what a fixed arm can reach.

Issue 30 asked whether the optimum on text is findable at all at its signal-to-noise ratio. The script prints,
per configuration, the mean gain over the bare host and its spread across episodes, next to the spread of the
bare host's own accuracy across episodes (which host an episode draws), the noise a controller's return carries.

    python measurements/blueprint_returns.py --task text --host-preset text-starved --text-max-bytes 120000 \
        --device cuda --episodes 24 --workers 16 --json out.json
    python measurements/blueprint_returns.py --task digits-impaired --best conv_heavy --slot r0c1 --episodes 32 \
        --num-shards 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esper_ray.contracts.actions import parse_blueprint, topology_blueprints  # noqa: E402
from esper_ray.contracts.controllers import FixedSeed  # noqa: E402
from esper_ray.contracts.stages import Stage  # noqa: E402
from esper_ray.env.observation import SLOT_FEATURES, decode_stage, slot_offset  # noqa: E402
from esper_ray.morpho.hosts import topology_of  # noqa: E402
from esper_ray.policy.baselines import wait_action  # noqa: E402
from esper_ray.policy.fixed import FixedSeedController, first_acting  # noqa: E402


@dataclass(frozen=True)
class Plan:
    """One configuration: `blueprint` in `slot` germinated at `epoch`, fossilized asap unless `probation`; with
    `first` (`conv_heavy@r0c1`), that seed's fixed lifecycle runs from epoch 0 and this one is the second seed,
    planted once the env allows it (one seed in TRAINING at a time)."""

    blueprint: str | None = None
    slot: str = "r0c0"
    epoch: int = 0
    probation: bool = False
    first: str | None = None

    @property
    def label(self) -> str:
        if self.blueprint is None:
            return f"{self.first} alone" if self.first else "none"
        own = f"{self.blueprint}@{self.slot} e{self.epoch}" + (" probation" if self.probation else "")
        return f"{self.first} + {own}" if self.first else own


class PlanController(FixedSeedController):
    """The fixed arm's lifecycle, started at `epoch`; with `probation` it never fossilizes."""

    def __init__(self, plan: Plan, slot_ids, max_epochs: int, seed: FixedSeed) -> None:  # type: ignore[no-untyped-def]
        super().__init__(slot_ids, max_epochs, seed, min_training_epochs=10)
        self.plan = plan
        self.epochs_done = 0  # the epoch this decision starts

    def reset(self) -> None:
        self.epochs_done = 0

    def act(self, obs):  # type: ignore[no-untyped-def]
        epoch, self.epochs_done = self.epochs_done, self.epochs_done + 1
        if epoch < self.plan.epoch:
            return wait_action()
        if self.plan.probation:
            block = obs["features"][slot_offset(self.index) : slot_offset(self.index) + SLOT_FEATURES]
            if decode_stage(block) is Stage.HOLDING:
                return wait_action()
        return super().act(obs)


def run_plan(job: tuple[Plan, list[int], dict]) -> list[dict]:  # type: ignore[type-arg]
    plan, episodes, env_config = job
    from esper_ray.env.morphogenetic_env import MorphogeneticEnv

    torch.set_num_threads(1)
    env = MorphogeneticEnv(env_config)
    topology = topology_of(env_config["task"])
    slots, blueprints = list(env.slot_ids), topology_blueprints(topology)
    controllers: list[FixedSeedController] = []  # in order: the first that does not wait acts
    if plan.first is not None:
        blueprint, slot = plan.first.split("@")
        controllers.append(
            FixedSeedController(
                slots,
                env_config["max_epochs"],
                FixedSeed(parse_blueprint(blueprint, blueprints, topology), slot),
                min_training_epochs=10,
            )
        )
    if plan.blueprint is not None:
        seed = FixedSeed(parse_blueprint(plan.blueprint, blueprints, topology), plan.slot)
        controllers.append(PlanController(plan, slots, env_config["max_epochs"], seed))
    gamma = env.reward_config.gamma
    rows = []
    for episode in episodes:
        obs, _ = env.reset(seed=episode)
        for controller in controllers:
            controller.reset()
        done, t, ret, curve = False, 0, 0.0, []
        while not done:
            action = first_acting(controllers, obs)
            obs, reward, terminated, truncated, info = env.step(action)
            ret += gamma**t * reward
            curve.append(info["committed_accuracy"])
            t += 1
            done = terminated or truncated
        test = env.measure_test()
        rows.append(
            {
                "plan": plan.label,
                "episode": episode,
                "shard": env_config.get("shard", 0),
                "return": ret,
                "val": info["committed_accuracy"],
                "test": test.accuracy,
                "test_with_probation": test.accuracy_with_probation,
                "params": info["committed_seed_params"],
                "fossilized": info["count/fossilized"],
                "germinated": info["count/germinated"],
                "refused": info["count/refused"],
                "curve": curve,
            }
        )
    return rows


def plans(
    blueprints: list[str], best: str, slots: list[str], epochs: list[int], slot: str = "r0c0", first: str | None = None
) -> list[Plan]:
    """The bare host, then (with `first`) that seed alone, then every plan, each after `first` where it is given."""
    out = [Plan(b, slot=slot, first=first) for b in blueprints]
    taken = first.split("@")[1] if first else None  # the first seed's slot holds no second one
    out += [Plan(best, slot=s, first=first) for s in slots if s not in (slot, taken)]
    out += [Plan(best, slot=slot, epoch=e, first=first) for e in epochs if e != 0]
    out.append(Plan(best, slot=slot, probation=True, first=first))
    return [Plan()] + ([Plan(first=first)] if first else []) + out


def headroom(by_plan: dict[str, dict[int, dict]], episodes: list[int]) -> tuple[str, float, float, int]:  # type: ignore[type-arg]
    """The headroom of a controller that adapts to the episode: the best plan for all episodes (what a fixed arm can
    be) and its mean test accuracy, the mean of each episode's best plan (an oracle), and on how many episodes
    another plan beats the best one."""
    means = {
        label: np.mean([per[e]["test"] for e in episodes])
        for label, per in by_plan.items()
        if len(per) == len(episodes)
    }
    best = max(means, key=means.__getitem__)
    oracle = {e: max(per[e]["test"] for per in by_plan.values() if e in per) for e in episodes}
    beaten = sum(oracle[e] > by_plan[best][e]["test"] for e in episodes)
    return best, float(means[best]), float(np.mean(list(oracle.values()))), int(beaten)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="text")
    parser.add_argument("--host-preset", default="text-starved")
    parser.add_argument("--text-max-bytes", type=int, default=120_000)
    parser.add_argument("--max-epochs", type=int, default=25)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--best", default="attention", help="the blueprint tried in other slots, later, on probation")
    parser.add_argument("--epochs", type=int, nargs="+", default=[0, 3, 6, 9])
    parser.add_argument(
        "--slot",
        default="r0c0",
        choices=["r0c0", "r0c1", "r0c2"],
        help="the slot every blueprint is planted in (--best is also tried in the others)",
    )
    parser.add_argument(
        "--first",
        help="a seed planted first in every plan, as BLUEPRINT@SLOT (conv_heavy@r0c1): "
        "the plans are then second seeds, and the table also has this seed alone",
    )
    parser.add_argument(
        "--num-shards",
        type=int,
        default=1,
        help="train each host on one shard of this many, as an "
        "env of a run with this many envs does (episode i on shard i mod num-shards)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write every episode's figures here")
    args = parser.parse_args()
    if args.first is not None and (args.first.count("@") != 1 or args.first.split("@")[1] == args.slot):
        parser.error(f"--first {args.first}: must be BLUEPRINT@SLOT in a slot other than --slot {args.slot}")
    env_config = {
        "task": args.task,
        "max_epochs": args.max_epochs,
        "seed": 0,
        "reward_mode": "committed",
        "device": args.device,
        "num_shards": args.num_shards,
    }
    topology = topology_of(args.task)
    if topology == "transformer":
        env_config.update(host_preset=args.host_preset, text_max_bytes=args.text_max_bytes)
    blueprints = [b.key for b in topology_blueprints(topology)]
    slots = ["r0c0", "r0c1", "r0c2"]
    episodes = [1000 + i for i in range(args.episodes)]
    chunk = max(1, args.episodes // 4)
    chunk = -(-chunk // args.num_shards) * args.num_shards  # whole rounds of shards
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    jobs = []
    for i, plan in enumerate(plans(blueprints, args.best, slots, args.epochs, args.slot, args.first)):
        for start in range(0, len(episodes), chunk):
            config = dict(env_config)
            if gpus:  # spread the jobs over the GPUs
                config["device"] = f"cuda:{(i + start) % gpus}"
            for shard in range(args.num_shards):  # episode i on shard i mod num_shards
                part = [e for e in episodes[start : start + chunk] if (e - 1000) % args.num_shards == shard]
                jobs.append((plan, part, dict(config, shard=shard)))
    card = "cpu"
    if args.device == "cuda":
        card = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    commit = (
        os.environ.get("COMMIT")
        or subprocess.run(  # COMMIT: a copy of the code outside its repository
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    host = f"{args.host_preset}, " if topology == "transformer" else ""
    print(
        f"# {args.task} ({host}shards of {args.num_shards}), {args.episodes} paired episodes "
        f"of {args.max_epochs} epochs, {len(jobs)} jobs on {args.workers} workers; {card or platform.machine()}; "
        f"commit {commit}",
        flush=True,
    )
    started = time.time()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        rows = [r for part in pool.imap_unordered(run_plan, jobs) for r in part]
    by_plan: dict[str, dict[int, dict]] = {}  # type: ignore[type-arg]
    for r in rows:
        by_plan.setdefault(r["plan"], {})[r["episode"]] = r
    none = by_plan["none"]
    print(f"wall {time.time() - started:.0f} s\n")
    spread = np.std([none[e]["test"] for e in episodes], ddof=1)
    print(
        f"bare host over episodes: test {np.mean([none[e]['test'] for e in episodes]):.4f} +- {spread:.4f} (sd), "
        f"committed return {np.mean([none[e]['return'] for e in episodes]):.2f} "
        f"+- {np.std([none[e]['return'] for e in episodes], ddof=1):.2f}\n"
    )
    print(
        "| plan | test gain (pts) | sd of paired gain | gain > 0 | return gain | sd of paired return gain "
        "| sd of return | params kept | germinated | fossilized | refused |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, per in by_plan.items():
        common = [e for e in episodes if e in per]
        gain = np.array([100 * (per[e]["test"] - none[e]["test"]) for e in common])
        rgain = np.array([per[e]["return"] - none[e]["return"] for e in common])
        print(
            f"| {label} | {gain.mean():+.2f} | {gain.std(ddof=1):.2f} | {np.mean(gain > 0):.2f} | {rgain.mean():+.2f} "
            f"| {rgain.std(ddof=1):.2f} | {np.std([per[e]['return'] for e in common], ddof=1):.2f} "
            f"| {np.mean([per[e]['params'] for e in common]):,.0f} "
            f"| {np.mean([per[e]['germinated'] for e in common]):.2f} "
            f"| {np.mean([per[e]['fossilized'] for e in common]):.2f} "
            f"| {np.mean([per[e]['refused'] for e in common]):.1f} |"
        )
    best, best_mean, oracle, beaten = headroom(by_plan, episodes)
    print(
        f"\nbest plan for all episodes: {best}, test {best_mean:.4f}; each episode's best plan (an oracle): "
        f"{oracle:.4f}; another plan beats {best} on {beaten} of {len(episodes)} episodes"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"card": card, "commit": commit, "args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=0
            )
        )


if __name__ == "__main__":
    main()
