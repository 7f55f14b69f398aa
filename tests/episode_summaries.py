"""One EpisodeSummary for tests of what reads them (reports, trials, eval lines): plain defaults, the fields a test
cares about given."""

from __future__ import annotations

from typing import Any

from esper_ray.train.commands.episodes import EpisodeSummary

DEFAULTS: dict[str, Any] = {
    "episode": 0,
    "steps": 3,
    "episode_return": 0.0,
    "initial_accuracy": 0.1,
    "final_accuracy": 0.5,
    "host_params": 160,
    "params_added": 0,
    "germinated": 0,
    "fossilized": 0,
    "pruned": 0,
    "rollbacks": 0,
    "refused": 0,
    "train_flops": 1,
    "seed_train_flops": 0,
    "validation_flops": 1,
    "counterfactual_flops": 0,
    "rolled_back": False,
    "seconds": 1.0,
    "test_accuracy": 0.5,
    "test_loss": 1.0,
}


def episode_summary(**fields: Any) -> EpisodeSummary:
    return EpisodeSummary(**{**DEFAULTS, **fields})
