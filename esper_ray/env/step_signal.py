"""What the reward reads of one step (contracts/rewards.py StepSignal): every slot before and after the step, and
the validation before and after."""

from __future__ import annotations

from typing import Any

from esper_ray.contracts.actions import FactoredAction
from esper_ray.contracts.rewards import SlotSignal, StepSignal
from esper_ray.contracts.stages import Stage
from esper_ray.env.epoch import ValStats
from esper_ray.morpho.counterfactual import CounterfactualPlan
from esper_ray.morpho.model import MorphogeneticModel


def slot_snapshot(model: MorphogeneticModel) -> dict[str, dict[str, Any]]:
    """Each slot as the step found it, for the signal's `before` side."""
    return {
        s.slot_id: {
            "stage": s.stage,
            "epochs_in_stage": s.metrics.epochs_in_stage,
            "alpha": s.alpha.alpha,
            "contribution": s.metrics.contribution,
            "age": s.metrics.age,
            "accuracy_at_germination": s.metrics.accuracy_at_germination,
            "seed_params": s.seed_params,
        }
        for s in model.seed_slots()
    }


def step_signal(
    env: Any,
    decision: FactoredAction,
    success: bool,
    before: dict[str, dict[str, Any]],
    plan: CounterfactualPlan,
    val: ValStats,
    prev_val: ValStats,
) -> StepSignal:
    """The signal of the step a MorphogeneticEnv just took (its model, epoch, escrow and drip pools as the step left
    them). `env` is typed Any: the env module imports this one."""
    assert env.model is not None
    slots = []
    for s in env.model.seed_slots():
        b = before[s.slot_id]
        slots.append(
            SlotSignal(
                slot_id=s.slot_id,
                stage_before=b["stage"],
                stage_after=s.stage,
                epochs_in_stage_before=b["epochs_in_stage"],
                epochs_in_stage_after=s.metrics.epochs_in_stage,
                age=s.metrics.age if s.is_live or s.stage is Stage.FOSSILIZED else b["age"],
                contribution=b["contribution"],
                contribution_after=s.metrics.contribution,
                accuracy_at_germination=b["accuracy_at_germination"]
                if b["stage"] is not Stage.DORMANT
                else s.metrics.accuracy_at_germination,
                seed_params=max(s.seed_params, b["seed_params"]),
                alpha_before=b["alpha"],
                alpha_after=s.alpha.alpha,
                escrow_credit=env.escrow_credits[s.slot_id],
                interaction_sum=s.metrics.interaction_sum,
                drip_pool=env.drip_pools[s.slot_id],
            )
        )
    return StepSignal(
        epoch=env.epoch,
        max_epochs=env.cfg.max_epochs,
        op=decision.op,
        target_slot=decision.slot,
        action_success=success,
        val_accuracy=val.accuracy(0),
        prev_val_accuracy=prev_val.accuracy(0),
        initial_val_accuracy=env.initial_accuracy,
        val_loss=val.loss(0),
        prev_val_loss=prev_val.loss(0),
        random_guess_loss=env.random_guess_loss,
        committed_accuracy=val.accuracy(plan.committed_index),
        host_params=env.model.host_params,
        slots=tuple(slots),
    )
