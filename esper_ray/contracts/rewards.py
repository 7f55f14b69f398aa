"""Reward modes, their settings, and the typed per-step signal every reward function reads (DOMAIN.md section 8).

Accuracies in the signal are fractions in [0, 1]; reward functions convert to percentage points where the
original's thresholds are stated in pp (`PP = 100`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from esper_ray.contracts.actions import Op
from esper_ray.contracts.stages import Stage

PP = 100.0  # fraction -> percentage points


class RewardMode(str, Enum):
    SHAPED = "shaped"
    SIMPLIFIED = "simplified"
    SPARSE = "sparse"
    BASIC = "basic"
    BASIC_PLUS = "basic_plus"
    ESCROW = "escrow"
    MINIMAL = "minimal"
    COMMITTED = "committed"
    """The committed model's accuracy gain, as a potential difference (rewards/committed.py)."""


class RewardFamily(str, Enum):
    CONTRIBUTION = "contribution"
    LOSS = "loss"


# Stage potential for PBRS; a seed's potential also grows with time in stage (capped).
STAGE_POTENTIAL: dict[Stage, float] = {
    Stage.GERMINATED: 1.0,
    Stage.TRAINING: 2.0,
    Stage.BLENDING: 3.5,
    Stage.HOLDING: 5.5,
    Stage.FOSSILIZED: 6.0,
}


@dataclass(frozen=True)
class RewardConfig:
    mode: RewardMode = RewardMode.COMMITTED
    family: RewardFamily = RewardFamily.CONTRIBUTION
    gamma: float = 0.995
    """Discount used by PBRS; must equal PPO's gamma so shaping leaves the optimal policy unchanged."""
    pbrs_weight: float = 0.3
    param_budget: int = 500_000
    """Parameter scale of the sparse and basic modes' parameter cost."""
    param_penalty_weight: float = 0.1
    sparse_scale: float = 1.0
    basic_acc_delta_weight: float = 5.0
    rent_host_params_floor: int = 200
    rollback_penalty: float = -10.0
    """Reward of the step on which the governor rolled the model back (the episode then terminates)."""
    loss_sigma: float = 0.05
    """loss family: typical validation-loss change per epoch, for scaling."""
    loss_target: float = 0.3
    """loss family: loss at which the terminal bonus saturates."""
    loss_rent_weight: float = 0.05
    loss_rent_grace_epochs: int = 3
    param_cost_pp: float = 1.0
    """committed mode: accuracy points charged per doubling of the network by its seeds."""
    committed_stage_weight: float = 1.0
    """committed mode: weight of the potential-based shaping on the seeds' lifecycle stages (accuracy points)."""

    @property
    def ablates_fossils(self) -> bool:
        """basic_plus pays fossils by their ongoing contribution, so the counterfactual pass switches them off too."""
        return self.mode is RewardMode.BASIC_PLUS

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", RewardMode(self.mode))
        except ValueError:
            raise ValueError(
                f"reward_mode={self.mode!r}: unknown; choose one of {[m.value for m in RewardMode]}"
            ) from None
        try:
            object.__setattr__(self, "family", RewardFamily(self.family))
        except ValueError:
            raise ValueError(
                f"reward_family={self.family!r}: unknown; choose one of {[f.value for f in RewardFamily]}"
            ) from None
        if self.family is RewardFamily.LOSS and self.mode is not RewardMode.SHAPED:
            raise ValueError(
                f"reward_family='loss' works only with reward_mode='shaped', got reward_mode={self.mode.value!r}; "
                f"use reward_family='contribution' for {self.mode.value}"
            )
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma!r}: must be in (0, 1]")


@dataclass(frozen=True)
class SlotSignal:
    """One slot, seen before the decision was applied (`*_before`) and after the epoch."""

    slot_id: str
    stage_before: Stage
    stage_after: Stage
    epochs_in_stage_before: int = 0
    epochs_in_stage_after: int = 0
    age: int = 0
    contribution: float | None = None
    """Counterfactual contribution measured at the last validation before the decision (fraction)."""
    contribution_after: float | None = None
    accuracy_at_germination: float | None = None
    seed_params: int = 0
    alpha_before: float = 0.0
    alpha_after: float = 0.0
    escrow_credit: float = 0.0
    """escrow mode: credit outstanding for this slot before the step."""
    interaction_sum: float = 0.0
    """Sum of this seed's pair interactions with the other ablated seeds (fraction)."""
    drip_pool: float = 0.0
    """basic_plus: fossilize bonus still to be paid out for this slot, before the step."""


@dataclass(frozen=True)
class StepSignal:
    epoch: int
    """Epochs trained so far, this step's included (1..max_epochs)."""
    max_epochs: int
    op: Op
    target_slot: str | None
    """Slot the decision addressed (None for WAIT)."""
    action_success: bool
    val_accuracy: float
    prev_val_accuracy: float
    initial_val_accuracy: float
    """Accuracy at the start of the episode (before any training)."""
    val_loss: float
    prev_val_loss: float
    random_guess_loss: float
    """ln(num_classes): the loss of a uniform guess."""
    committed_accuracy: float
    """Accuracy with every non-fossilized seed off, i.e. only fossils on (equals val_accuracy when there is none)."""
    host_params: int
    slots: tuple[SlotSignal, ...] = field(default_factory=tuple)

    @property
    def is_terminal(self) -> bool:
        return self.epoch >= self.max_epochs

    @property
    def target(self) -> SlotSignal | None:
        return next((s for s in self.slots if s.slot_id == self.target_slot), None)

    @property
    def cf_total(self) -> float:
        """Improvement the non-fossilized seeds bring together (fraction)."""
        return self.val_accuracy - self.committed_accuracy


@dataclass(frozen=True)
class RewardBreakdown:
    total: float
    components: dict[str, float]
    escrow_credits: dict[str, float] = field(default_factory=dict)
    """escrow mode: credit per slot after the step (empty for other modes)."""
    drip_pools: dict[str, float] = field(default_factory=dict)
    """basic_plus: bonus left to drip per slot after the step (empty for other modes)."""


def breakdown(
    components: dict[str, float],
    escrow_credits: dict[str, float] | None = None,
    drip_pools: dict[str, float] | None = None,
) -> RewardBreakdown:
    return RewardBreakdown(
        total=float(sum(components.values())),
        components=components,
        escrow_credits=escrow_credits or {},
        drip_pools=drip_pools or {},
    )
