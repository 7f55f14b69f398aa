"""What a slot knows about its seed's progress: ages, accuracies, gradients, counterfactual contribution."""

from __future__ import annotations

from dataclasses import dataclass

# EMA weight of the previous contribution velocity (DOMAIN.md section 6: 0.7 old / 0.3 new).
CONTRIBUTION_VELOCITY_DECAY = 0.7
# Gradient health thresholds on per-parameter gradient norms (DOMAIN.md section 1, G2).
VANISHING_GRAD_NORM = 1e-7
EXPLODING_GRAD_NORM = 10.0
GRAD_RATIO_CLAMP = 10.0


@dataclass
class GradientStats:
    seed_norm: float
    host_norm: float
    ratio: float
    """(seed_norm / host_norm) * sqrt(host_params / seed_params), clamped at 10."""
    health: float
    """1 - 0.5 * fraction vanishing - 0.8 * fraction exploding, over the seed's per-parameter norms."""
    has_vanishing: bool
    has_exploding: bool


@dataclass
class SeedMetrics:
    age: int = 0
    """Epochs since germination."""
    epochs_in_stage: int = 0
    accuracy_at_germination: float | None = None
    accuracy_at_stage_start: float | None = None
    current_accuracy: float | None = None
    gradients: GradientStats | None = None
    previous_health: float | None = None
    contribution: float | None = None
    """Counterfactual contribution: accuracy with the seed as is minus with it off (fraction)."""
    contribution_velocity: float = 0.0
    epochs_since_contribution: int | None = None
    interaction_sum: float = 0.0
    """Sum of the pair interactions I_ab with every other ablated seed at the last validation (fraction)."""

    @property
    def stage_improvement(self) -> float | None:
        if self.current_accuracy is None or self.accuracy_at_stage_start is None:
            return None
        return self.current_accuracy - self.accuracy_at_stage_start

    @property
    def is_healthy(self) -> bool:
        return self.gradients is None or not self.gradients.has_exploding

    def record_contribution(self, contribution: float) -> None:
        if self.contribution is not None:
            change = contribution - self.contribution
            self.contribution_velocity = (
                CONTRIBUTION_VELOCITY_DECAY * self.contribution_velocity + (1 - CONTRIBUTION_VELOCITY_DECAY) * change
            )
        self.contribution = contribution
        self.epochs_since_contribution = 0

    def record_gradients(self, stats: GradientStats) -> None:
        if self.gradients is not None:
            self.previous_health = self.gradients.health
        self.gradients = stats
