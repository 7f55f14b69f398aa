"""Grow your own MLP on your own numpy data: train a controller, let it grow one network, reload that network.

    python examples/grow_mlp.py                 # 8 rounds of 4 episodes: 150 s on 2 CPU cores
    python examples/grow_mlp.py --small         # 1 round of 1 short episode, about a minute: a smoke run, no seed kept

The parts are in my_mlp.py, next to this file; `--plugins my_mlp` makes every process import it (Ray's workers
inherit this script's sys.path, which holds this folder). docs/plugins.md explains each step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grow import grow

if __name__ == "__main__":
    sys.exit(
        grow(
            Path(__file__).parent,
            plugin="my_mlp",
            settings=["--task", "spirals", "--slots", "b0", "b1", "b2"],
            input_shape=(2, 20),
        )
    )
