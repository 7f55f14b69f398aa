"""How to open what a command writes in TensorBoard, with how to install TensorBoard where it is missing.

Runs write their TensorBoard logs through tensorboardX (which Ray Tune brings); the viewer itself is another package,
which the `dev` extra leaves out and the `dashboard` extra installs with Ray's dashboard. Light on purpose: `esper-ray
report` prints the line without importing Ray.
"""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

INSTALL_VIEWERS = "pip install -e '.[dashboard]'"
"""Installs TensorBoard and Ray's dashboard (pyproject.toml's `dashboard` extra), from the clone's folder."""


def tensorboard_command(logdir: Path | str) -> str:
    """`tensorboard --logdir LOGDIR`, followed by how to install TensorBoard when this Python does not have it."""
    command = f"tensorboard --logdir {shlex.quote(str(logdir))}"  # pasted into a shell as it is
    if importlib.util.find_spec("tensorboard") is None:
        command += f" (TensorBoard is not installed: {INSTALL_VIEWERS} installs it)"
    return command
