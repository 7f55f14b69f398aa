"""The `esper-ray` command line. Each subcommand is a thin wrapper over a function of the package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import json

from esper_ray.cli_args import add_dataclass_arguments, given
from esper_ray.contracts.actions import CNN_BLUEPRINTS
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.morpho.blueprints import build_seed, count_params
from esper_ray.morpho.host import HOST_PRESETS, CNNHost, host_preset


def _cmd_host(args: argparse.Namespace) -> int:
    host = CNNHost(host_preset(args.task))
    print(f"task {args.task}: host {count_params(host):,} parameters, slots {', '.join(host.slot_ids)}")
    header = f"{'slot':<6}{'C x H x W':>12}" + "".join(f"{b.key:>12}" for b in CNN_BLUEPRINTS)
    print(header)
    for slot in host.slot_ids:
        c, h, w = host.slot_shape(slot)
        counts = "".join(f"{count_params(build_seed(b, c)):>12,}" for b in CNN_BLUEPRINTS)
        print(f"{slot:<6}{f'{c} x {h} x {w}':>12}{counts}")
    return 0


ENV_FLAGS_HELP = "environment (one env per episode; same names as env_config keys)"


def _cmd_heuristic(args: argparse.Namespace) -> int:
    from esper_ray.train.episodes import format_summary
    from esper_ray.train.heuristic import run_heuristic

    env_config = given(args, args.env_fields)
    summaries = run_heuristic(env_config, args.episodes, progress=not args.json)
    if args.json:
        print(json.dumps([s.as_dict() for s in summaries], indent=2))
    else:
        for s in summaries:
            print(format_summary(s))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="esper-ray",
        description="Grow neural networks while they train, with a PPO controller deciding when and what to grow.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    host = sub.add_parser("host", help="show a task's host network: its slots and each blueprint's parameter count")
    host.add_argument("--task", default="digits", choices=sorted(HOST_PRESETS), help="task preset (default: digits)")
    host.set_defaults(func=_cmd_host)

    heuristic = sub.add_parser(
        "heuristic",
        help="run the heuristic controller and print each episode's outcome",
        description="Run the rule-based controller (germinate on plateau, fossilize seeds that contribute, prune "
        "those that hurt) for some episodes and print, per episode: final accuracy, parameters added and seeds "
        "germinated/fossilized/pruned.",
    )
    heuristic.add_argument("--episodes", type=int, default=1, help="episodes to run (default: 1)")
    heuristic.add_argument("--json", action="store_true", help="print the summaries as JSON (no progress bar)")
    env_group = heuristic.add_argument_group(ENV_FLAGS_HELP)
    heuristic.set_defaults(func=_cmd_heuristic, env_fields=add_dataclass_arguments(env_group, EnvConfig, exclude=("shard", "num_shards", "gamma")))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as err:  # bad settings or missing data: one clear line, no traceback
        parser.exit(2, f"esper-ray {args.command}: error: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
