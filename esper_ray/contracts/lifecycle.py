"""Lifecycle settings: gate thresholds, durations and auto-forward switches (DOMAIN.md section 1).

Accuracies are fractions in [0, 1] everywhere in code; "0.5 pp" in DOMAIN.md is 0.005 here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from esper_ray.contracts.actions import Tempo
from esper_ray.contracts.fields import check_int


class GateMode(str, Enum):
    PERMISSIVE = "permissive"
    STRICT = "strict"


@dataclass(frozen=True)
class LifecycleConfig:
    gate_mode: GateMode = GateMode.PERMISSIVE
    """permissive (RL default) or strict gates G2/G3/G5."""
    min_training_epochs: int = 10
    """G2: epochs a seed must spend in TRAINING before it may blend."""
    strict_min_improvement: float = 0.005
    """G2 strict: validation accuracy gain since TRAINING began (fraction; 0.5 pp)."""
    strict_min_grad_ratio: float = 0.10
    """G2 strict: parameter-normalised seed/host gradient ratio."""
    min_gradient_health: float = 0.7
    """G2 permissive: gradient health score in [0, 1]."""
    strict_min_blending_epochs: int = 10
    """G3 strict: epochs in BLENDING before HOLDING."""
    strict_min_fossilize_contribution: float = 0.01
    """G5 strict: counterfactual contribution (fraction; 1 pp)."""
    min_prune_age: int = 5
    """A seed younger than this (epochs since germination) may not be pruned."""
    embargo_epochs: int = 5
    """Ticks a slot stays EMBARGOED after a prune."""
    auto_forward: bool = True
    """Advance GERMINATED->TRAINING->BLENDING->HOLDING automatically when gates pass (as every shipped
    config of the original did). When on, the ADVANCE op is masked out."""
    seed_lr: float = 0.01
    """SGD learning rate of each seed's own optimizer (momentum 0.9)."""
    seed_momentum: float = 0.9
    blended_seed_lr: float | None = None
    """Learning rate of a seed's optimizer from BLENDING on, when the seed is part of the model's output;
    None keeps `seed_lr`."""

    def commit_steps(self, tempo: Tempo) -> int:
        """Steps from a GERMINATE at this tempo to the soonest FOSSILIZE the gates can allow: TRAINING's minimum,
        the tempo's ramp, one step in HOLDING, and with auto-forward off one more to ADVANCE out of GERMINATED. A
        lower bound: gate G2's health test and the strict gates can only make it later."""
        return self.min_training_epochs + tempo.epochs + 1 + (0 if self.auto_forward else 1)

    def min_epochs_to_keep(self, tempo: Tempo | None = None) -> int:
        """The shortest run (max_epochs) in which a seed can be kept: one planted at the first step at `tempo` (None:
        the fastest, FAST) is fossilized at step 1 + commit_steps at the soonest. A lower bound, as commit_steps is."""
        return 1 + (self.commit_steps(tempo) if tempo is not None else min(self.commit_steps(t) for t in Tempo))

    @staticmethod
    def commits_in_time(epoch: int, commit_steps: int, max_epochs: int) -> bool:
        """Whether a seed germinated on the observation of `epoch` (epochs trained so far, so at step epoch + 1)
        and needing `commit_steps` can be fossilized by the run's last step, max_epochs. The env's commit_horizon
        and the heuristic's planting deadline both ask this."""
        return epoch + 1 + commit_steps <= max_epochs

    def __post_init__(self) -> None:
        object.__setattr__(self, "gate_mode", GateMode(self.gate_mode))
        for name in ("min_training_epochs", "strict_min_blending_epochs", "min_prune_age", "embargo_epochs"):
            check_int(name, getattr(self, name), 0)
        if not self.seed_lr > 0:
            raise ValueError(f"seed_lr={self.seed_lr!r}: must be > 0")
        if self.blended_seed_lr is not None and not self.blended_seed_lr > 0:
            raise ValueError(f"blended_seed_lr={self.blended_seed_lr!r}: must be > 0, or None to keep seed_lr")
