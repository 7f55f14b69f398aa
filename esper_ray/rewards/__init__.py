"""Reward modes, one module each; `compute_reward` picks the one a RewardConfig names."""

from __future__ import annotations

from collections.abc import Callable

from esper_ray.contracts.rewards import RewardBreakdown, RewardConfig, RewardFamily, RewardMode, StepSignal
from esper_ray.rewards import basic, basic_plus, committed, escrow, loss, minimal, shaped, simplified, sparse

_CONTRIBUTION_MODES: dict[RewardMode, Callable[[StepSignal, RewardConfig], RewardBreakdown]] = {
    RewardMode.SHAPED: shaped.compute,
    RewardMode.SIMPLIFIED: simplified.compute,
    RewardMode.SPARSE: sparse.compute,
    RewardMode.BASIC: basic.compute,
    RewardMode.BASIC_PLUS: basic_plus.compute,
    RewardMode.ESCROW: escrow.compute,
    RewardMode.MINIMAL: minimal.compute,
    RewardMode.COMMITTED: committed.compute,
}


def compute_reward(signal: StepSignal, cfg: RewardConfig) -> RewardBreakdown:
    """The reward of one env step under `cfg`, with its components."""
    if cfg.family is RewardFamily.LOSS:
        return loss.compute(signal, cfg)
    return _CONTRIBUTION_MODES[cfg.mode](signal, cfg)
