"""Quality gates G1-G5 that a seed must pass to enter a stage (DOMAIN.md section 1)."""

from __future__ import annotations

from dataclasses import dataclass

from esper_ray.contracts.lifecycle import GateMode, LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.alpha_schedule import AlphaSchedule
from esper_ray.morpho.seed_metrics import SeedMetrics


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    failures: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.passed


def check_gate(
    target: Stage, stage: Stage, metrics: SeedMetrics, alpha: AlphaSchedule, cfg: LifecycleConfig
) -> GateResult:
    """Evaluate the gate guarding `stage -> target`. Pure: reads, never mutates."""
    strict = cfg.gate_mode is GateMode.STRICT
    failures: list[str] = []
    if target is Stage.TRAINING:
        gate = "G1"
        if stage is not Stage.GERMINATED:
            failures.append(f"stage is {stage.name}, not GERMINATED")
    elif target is Stage.BLENDING:
        gate = "G2"
        if metrics.epochs_in_stage < cfg.min_training_epochs:
            failures.append(f"{metrics.epochs_in_stage} epochs in TRAINING < {cfg.min_training_epochs}")
        grads = metrics.gradients
        if strict:
            improvement = metrics.stage_improvement
            if improvement is None or improvement < cfg.strict_min_improvement:
                failures.append(f"improvement {improvement} < {cfg.strict_min_improvement}")
            if grads is None or grads.ratio < cfg.strict_min_grad_ratio:
                failures.append(f"gradient ratio {grads and grads.ratio} < {cfg.strict_min_grad_ratio}")
        elif grads is None:
            failures.append("seed gradients never measured")
        else:
            if grads.has_exploding:
                failures.append("exploding seed gradients")
            if grads.health < cfg.min_gradient_health:
                failures.append(f"gradient health {grads.health:.2f} < {cfg.min_gradient_health}")
    elif target is Stage.HOLDING:
        gate = "G3"
        if alpha.target != 1.0 or not alpha.holding or alpha.alpha != 1.0:
            failures.append(f"alpha {alpha.alpha:.3f} has not settled at target 1.0 (target {alpha.target})")
        if strict and metrics.epochs_in_stage < cfg.strict_min_blending_epochs:
            failures.append(f"{metrics.epochs_in_stage} epochs in BLENDING < {cfg.strict_min_blending_epochs}")
    elif target is Stage.FOSSILIZED:
        gate = "G5"
        if metrics.contribution is None:
            failures.append("no counterfactual contribution measured yet")
        elif strict and metrics.contribution < cfg.strict_min_fossilize_contribution:
            failures.append(f"contribution {metrics.contribution:.4f} < {cfg.strict_min_fossilize_contribution}")
        if not metrics.is_healthy:
            failures.append("seed gradients exploding")
    else:
        gate = "G0"
    return GateResult(gate=gate, passed=not failures, failures=tuple(failures))
