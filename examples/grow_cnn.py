"""Grow your own CNN on the built-in digits task: train a controller, let it grow one network, reload that network.

    python examples/grow_cnn.py                 # 8 rounds of 4 episodes: 160 s on 2 CPU cores
    python examples/grow_cnn.py --small         # 1 round of 1 short episode, about a minute: a smoke run, no seed kept

The host is in my_cnn.py, next to this file; the task is esper-ray's own (`--task digits`), the host yours
(`--env host_preset=my-cnn`). docs/plugins.md explains each step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grow import grow

if __name__ == "__main__":
    sys.exit(
        grow(
            Path(__file__).parent,
            plugin="my_cnn",
            settings=["--task", "digits", "--env", "host_preset=my-cnn", "--slots", "stage1", "stage2"],
            input_shape=(2, 1, 8, 8),
        )
    )
