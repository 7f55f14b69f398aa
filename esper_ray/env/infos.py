"""The info dict of every reset and step (what callbacks, episode summaries and tests read), and the timing of each
phase of a step."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

from esper_ray.contracts.rewards import RewardBreakdown
from esper_ray.env.epoch import TrainStats


def step_info(
    env: Any,
    *,
    reward: RewardBreakdown | None,
    timings: dict[str, float],
    train: TrainStats | None,
    rollback_reason: str = "",
) -> dict[str, Any]:
    """A MorphogeneticEnv's info after a reset or step. `env` is typed Any: the env module imports this one."""
    assert env.model is not None
    info: dict[str, Any] = {
        "epoch": env.epoch,
        "episode_seed": env._episode_seed,
        **({"family_member": env.member} if env.member is not None else {}),
        "val_accuracy": env.val.accuracy(),
        "val_loss": env.val.loss(),
        "committed_accuracy": env.committed_accuracy,
        "val_correct": env.val.correct[0],
        "val_total": env.val.samples,
        "host_params": env.model.host_params,
        "seed_params": env.model.seed_params,
        "committed_seed_params": env.model.committed_seed_params,
        "total_params": env.model.host_params + env.model.seed_params,
        "stages": {s.slot_id: s.stage.name for s in env.model.seed_slots()},
        "last_op": env.last_op.name if env.last_op is not None else "NONE",
        "action_success": env.last_success,
        "rollback": rollback_reason,
        "graph_captures": env.graphs.captures + env.val_graphs.captures,  # over the env's life
        **{f"count/{k}": v for k, v in env.counts.items()},
        **env.flops.as_info(),
        **{f"time/{k}": v for k, v in timings.items()},
    }
    if env.data.tokens:  # per-token perplexity; a classifier's exp(loss) would read as one and mean nothing
        info["val_perplexity"] = math.exp(min(env.val.loss(), 50.0))
    if train is not None:
        info.update(
            train_accuracy=train.accuracy,
            train_loss=train.loss,
            train_correct=train.correct,
            train_total=train.samples,
            train_batches=train.batches,
        )
    if reward is not None:
        info.update({f"reward/{k}": v for k, v in reward.components.items()})
    if env.precision.scaler is not None:
        info["grad_scale"] = float(env.precision.scaler.get_scale())
    return info


@contextlib.contextmanager
def timed(timings: dict[str, float], phase: str):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = time.perf_counter() - start
