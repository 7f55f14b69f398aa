"""What both examples do: `esper-ray train` a controller on your host, `esper-ray eval --save` one grown network,
then `esper_ray.load_grown` it back and run it. The same as typing the commands, with --plugins naming your module."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import esper_ray
from esper_ray.cli import main

FULL = ["--rounds", "8", "--envs", "2", "--episodes-per-env", "2", "--max-epochs", "25"]
SMALL = ["--rounds", "1", "--envs", "1", "--episodes-per-env", "1", "--max-epochs", "3", "--cpus-per-env", "0.5"]


def grow(here: Path, *, plugin: str, settings: list[str], input_shape: tuple[int, ...]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--small",
        action="store_true",
        help="a smoke run: 1 round of 1 episode of 3 epochs, too short "
        "for a seed to be kept (train and eval say so in one line); the network is the host alone",
    )
    parser.add_argument("--output", default=str(here / "runs"), help="folder for the run and the grown network")
    args = parser.parse_args()
    output = Path(args.output) / f"{plugin}-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    code = main(
        ["train", "--plugins", plugin, *settings, *(SMALL if args.small else FULL), "--output", str(output / "run")]
    )
    if code != 0:
        return code
    code = main(["eval", "--checkpoint", str(output / "run"), "--save", str(output / "grown"), "--json"])
    if code != 0:
        return code
    network = esper_ray.load_grown(
        output / "grown", plugins=[plugin]
    )  # your module, named by you: never the file's list
    architecture = json.loads((output / "grown" / "architecture.json").read_text())
    with torch.no_grad():
        logits = network(torch.zeros(input_shape))
    seeds = ", ".join(f"{s['blueprint']} in {s['slot']}" for s in architecture["seeds"]) or "none"
    print(
        f"reloaded the grown network from {output / 'grown'}: host {architecture['host']} "
        f"({architecture['params']['host']:,} parameters), kept seeds: {seeds} "
        f"({architecture['params']['seeds']:,} parameters); test accuracy {architecture['run']['test_accuracy']:.3f}; "
        f"logits {tuple(logits.shape)}; {time.perf_counter() - start:.0f} s in all"
    )
    return 0
