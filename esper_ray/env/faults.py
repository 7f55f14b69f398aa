"""Faults that tests inject to check that runs survive them; off unless an environment variable asks.

ESPER_RAY_TEST_NAN_AT_EPOCH=N:seed=S poisons the host's weights with NaN just before epoch N of every episode
of the envs with seed S, as a diverging run would: the governor must roll back, end the episode `terminated`,
and training must go on. Set before Ray starts, it reaches every worker.

ESPER_RAY_TEST_RAISE_AT_EPOCH=N:seed=S makes the step into epoch N raise, in the first episode that reaches it in
each process holding envs of seed S (once per process: RLlib recreates a failed env and samples on, and an env
that failed every episode would never finish a round). The run must go on and say what was raised.

ESPER_RAY_TEST_FAIL_TRIAL=ARM/SEED makes that A/B trial raise when it starts: Tune must retry it per the
experiment's `max_failures`, then mark it failed, and the rest of the experiment must complete.
"""

from __future__ import annotations

import os

import torch
from torch import nn

NAN_AT_EPOCH = "ESPER_RAY_TEST_NAN_AT_EPOCH"
RAISE_AT_EPOCH = "ESPER_RAY_TEST_RAISE_AT_EPOCH"
FAIL_TRIAL = "ESPER_RAY_TEST_FAIL_TRIAL"


class InjectedFault(RuntimeError):
    """Raised where a test asked for a failure."""


def fail_if_asked(trial_name: str) -> None:
    if os.environ.get(FAIL_TRIAL) == trial_name:
        raise InjectedFault(f"injected failure of trial {trial_name} ({FAIL_TRIAL})")


_raised_step_failure = False
"""Whether this process has raised the step failure RAISE_AT_EPOCH asked for."""


def _epoch_asked(variable: str, seed: int) -> int | None:
    value = os.environ.get(variable)
    if not value:
        return None
    epoch, _, target = value.partition(":seed=")
    return int(epoch) if int(target) == seed else None


def nan_epoch(seed: int) -> int | None:
    """The epoch to poison in envs of this seed, if a test asked for it."""
    return _epoch_asked(NAN_AT_EPOCH, seed)


def raise_if_asked(epoch: int, seed: int) -> None:
    """Raise InjectedFault in the step into `epoch` of an env of `seed`, if a test asked for it and this process
    has not raised it yet."""
    global _raised_step_failure
    if not _raised_step_failure and epoch == _epoch_asked(RAISE_AT_EPOCH, seed):
        _raised_step_failure = True
        raise InjectedFault(f"injected env step failure at epoch {epoch} ({RAISE_AT_EPOCH})")


def poison_with_nan(model: nn.Module) -> None:
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
