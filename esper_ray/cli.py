"""The `esper-ray` command line. Each subcommand is a thin wrapper over a function of the package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from esper_ray.contracts.actions import CNN_BLUEPRINTS
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="esper-ray",
        description="Grow neural networks while they train, with a PPO controller deciding when and what to grow.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    host = sub.add_parser("host", help="show a task's host network: its slots and each blueprint's parameter count")
    host.add_argument("--task", default="digits", choices=sorted(HOST_PRESETS), help="task preset (default: digits)")
    host.set_defaults(func=_cmd_host)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
