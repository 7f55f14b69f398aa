"""A fault that tests inject to check that training survives it; off unless an environment variable asks.

ESPER_RAY_TEST_NAN_AT_EPOCH=N poisons the host's weights with NaN just before epoch N of every episode, as a
diverging run would: the governor must roll back, end the episode `terminated`, and training must go on.
Tests pass it to env runners with `config.python_environment(extra_python_environs_for_worker=...)`.
"""

from __future__ import annotations

import os

import torch
from torch import nn

NAN_AT_EPOCH = "ESPER_RAY_TEST_NAN_AT_EPOCH"


def nan_epoch() -> int | None:
    value = os.environ.get(NAN_AT_EPOCH)
    return int(value) if value else None


def poison_with_nan(model: nn.Module) -> None:
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
