"""A seed slot: one injection point in the host that can grow, blend in, keep or prune a seed module.

Every lifecycle action validates completely before it changes anything, so a refused action (illegal
transition, failed gate, unknown blueprint) leaves the slot exactly as it was. Stage changes all go through
`_enter`, which checks the transition table.

Gradient isolation (DOMAIN.md section 2): while TRAINING, the seed reads `host.detach()` and the slot outputs
`host + (s - s.detach())`: the value is the host's exactly, the host's gradients are those of a host without
the seed, and the seed still receives dLoss/dOutput (a straight-through estimator). From BLENDING on, a CNN seed
keeps reading `host.detach()`; a transformer seed reads the residual stream itself, so the host co-adapts
through the seed path. That matters: ADD blends `host + alpha * (s - host)`, whose gradient to the host is
(1 - alpha) when s does not depend on it, so an isolated seed at alpha 1 cuts every host layer below its slot
off the loss. On the `text` host a seed blended in at r0c2 froze all three blocks, and the host stayed at the
accuracy it had when the blend ended (issue 19: 0.45 without growth, 0.22-0.26 with a kept seed).

The seed's optimizer belongs to the slot: created at germination, kept with its momentum across stage
changes, dropped at prune. It is never re-created behind the caller's back. Its learning rate is `seed_lr`
while TRAINING and `blended_seed_lr` (when set) from BLENDING on: a straight-through seed has no feedback from
its own output, so a large rate only pushes it further one way (on `text`, 0.3 kept G2 shut for 24 epochs),
while a blended seed is part of the model and may learn as fast as the host around it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from esper_ray.contracts.actions import AlphaCurve, AlphaSpeed, AlphaTarget, BlendAlgorithm, BlueprintId, Style, Tempo
from esper_ray.contracts.host import Topology
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import ACTIVE_STAGES, LIVE_STAGES, IllegalTransitionError, Stage, check_transition
from esper_ray.morpho import cpu_step
from esper_ray.morpho.alpha_schedule import AlphaSchedule
from esper_ray.morpho.blend import GatedBlend, blend, blend_configurations
from esper_ray.morpho.blueprints import build_seed, count_params, resolve_blueprint
from esper_ray.morpho.gates import GateResult, check_gate
from esper_ray.morpho.seed_metrics import (
    EXPLODING_GRAD_NORM,
    GRAD_RATIO_CLAMP,
    VANISHING_GRAD_NORM,
    GradientStats,
    SeedMetrics,
)

_NEXT_BY_ADVANCE = {Stage.GERMINATED: Stage.TRAINING, Stage.TRAINING: Stage.BLENDING, Stage.BLENDING: Stage.HOLDING}
_OK = GateResult(gate="-", passed=True)


def _refused(reason: str) -> GateResult:
    return GateResult(gate="precondition", passed=False, failures=(reason,))


class SeedSlot(nn.Module):
    def __init__(self, slot_id: str, channels: int, cfg: LifecycleConfig, topology: Topology = Topology.CNN) -> None:
        super().__init__()
        self.slot_id = slot_id
        self.channels = channels
        self.cfg = cfg
        self.topology = topology
        self.seed: nn.Module | None = None
        self.gate: GatedBlend | None = None
        # The live alpha as a tensor, so a captured or compiled forward reads its current value.
        self.register_buffer("alpha_value", torch.zeros(()), persistent=False)
        self.last_accuracy: float | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self.stage = Stage.DORMANT
        self.seed = None
        self.gate = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.blueprint: BlueprintId | None = None
        self.algorithm = BlendAlgorithm.ADD
        self.tempo_epochs = Tempo.STANDARD.epochs
        self.initial_target = 1.0
        self.initial_curve = AlphaCurve.LINEAR
        self.alpha = AlphaSchedule()
        self.alpha_value.zero_()
        self.metrics = SeedMetrics()
        self.pruning = False
        self.embargo_left = 0

    # ----------------------------------------------------------------- queries
    @property
    def is_live(self) -> bool:
        return self.stage in LIVE_STAGES

    @property
    def is_active(self) -> bool:
        """The seed runs in the forward pass."""
        return self.stage in ACTIVE_STAGES and self.seed is not None

    @property
    def seed_params(self) -> int:
        total = 0
        for module in (self.seed, self.gate):
            if module is not None:
                total += count_params(module)
        return total

    def seed_parameters(self) -> list[nn.Parameter]:
        return [p for m in (self.seed, self.gate) if m is not None for p in m.parameters()]

    @property
    def isolated(self) -> bool:
        """The seed reads a detached copy of the host's features: always on a CNN, only while TRAINING on a
        transformer (see the module docstring)."""
        return self.topology is Topology.CNN or self.stage is Stage.TRAINING

    def can_prune(self) -> bool:
        return self.is_live and not self.pruning and self.metrics.age >= self.cfg.min_prune_age and self.alpha.holding

    def can_set_alpha_target(self) -> bool:
        return self.stage in (Stage.BLENDING, Stage.HOLDING) and self.alpha.holding and not self.pruning

    # ----------------------------------------------------------------- forward
    def forward(self, host: torch.Tensor, alpha_override: torch.Tensor | None = None) -> torch.Tensor:
        """Blend the seed into host features ([B, C, H, W] or [B, T, C]); `alpha_override` is one alpha per sample
        ([B, 1, 1, 1] or [B, 1, 1]) if given."""
        if not self.is_active:
            return host
        seed_in = host.detach() if self.isolated else host
        seed_out = self.seed(seed_in)  # type: ignore[misc]
        if alpha_override is not None:
            return blend(self.algorithm, host, seed_out, seed_in, alpha_override, self.gate)
        if self.stage is Stage.TRAINING:
            return host + (seed_out - seed_out.detach())
        return blend(self.algorithm, host, seed_out, seed_in, self.alpha_value, self.gate)

    def forward_configurations(self, host: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
        """The slot's output under each of K alphas ([K], on host's device) for the same features [B, ...]:
        [K*B, ...], configuration-major. The seed runs once, not K times (the fused validation pass, where the
        configurations part at this slot)."""
        seed_in = host.detach() if self.isolated else host
        return blend_configurations(self.algorithm, host, self.seed(seed_in), seed_in, alphas, self.gate)  # type: ignore[misc]

    # ---------------------------------------------------------- state changes
    def _enter(self, stage: Stage) -> None:
        check_transition(self.slot_id, self.stage, stage)
        self.stage = stage
        self.metrics.epochs_in_stage = 0
        self.metrics.accuracy_at_stage_start = self.last_accuracy

    def _set_alpha(self, target: float, steps: int, curve: AlphaCurve) -> None:
        self.alpha.retarget(target, steps, curve)
        self.alpha_value.fill_(self.alpha.alpha)

    def germinate(
        self,
        blueprint: str | BlueprintId,
        style: Style = Style.SIGMOID_ADD,
        tempo: Tempo = Tempo.STANDARD,
        alpha_target: AlphaTarget = AlphaTarget.FULL,
    ) -> GateResult:
        resolved = resolve_blueprint(blueprint, self.topology)
        check_transition(self.slot_id, self.stage, Stage.GERMINATED)
        device = self.alpha_value.device
        seed = build_seed(
            resolved, self.channels, self.topology, device, multiply=style.algorithm is BlendAlgorithm.MULTIPLY
        ).to(device)
        gate = GatedBlend(self.channels, self.topology).to(device) if style.algorithm is BlendAlgorithm.GATE else None
        self._enter(Stage.GERMINATED)
        self.seed, self.gate, self.blueprint = seed, gate, resolved
        self.algorithm, self.tempo_epochs, self.initial_target = style.algorithm, tempo.epochs, alpha_target.alpha
        self.initial_curve = style.curve
        self.metrics = SeedMetrics(
            accuracy_at_germination=self.last_accuracy, accuracy_at_stage_start=self.last_accuracy
        )
        # The fused SGD kernel: on CUDA one launch a step instead of the foreach version's several (a captured step
        # of the cifar10 host, bf16, H200: 1.628 -> 1.513 us a training sample, benchmarks/probes/fusion_probe.py); on
        # the CPU one call instead of a kernel per tensor (cpu_step.py).
        self.optimizer = torch.optim.SGD(
            self.seed_parameters(),
            lr=self.cfg.seed_lr,
            momentum=self.cfg.seed_momentum,
            fused=cpu_step.fused_sgd(device),
        )
        return _OK

    def check_advance(self) -> GateResult:
        if self.stage not in _NEXT_BY_ADVANCE:
            target = Stage.FOSSILIZED if self.stage is Stage.HOLDING else Stage.TRAINING
            raise IllegalTransitionError(
                self.slot_id, self.stage, target, "ADVANCE moves only GERMINATED, TRAINING, BLENDING"
            )
        if self.pruning:
            return _refused("a prune is ramping alpha down")
        return check_gate(_NEXT_BY_ADVANCE[self.stage], self.stage, self.metrics, self.alpha, self.cfg)

    def advance(self) -> GateResult:
        result = self.check_advance()
        if not result:
            return result
        target = _NEXT_BY_ADVANCE[self.stage]
        self._enter(target)
        if target is Stage.BLENDING:
            self._set_alpha(self.initial_target, self.tempo_epochs, self.initial_curve)
            if self.cfg.blended_seed_lr is not None and self.optimizer is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.cfg.blended_seed_lr
        return result

    def fossilize(self) -> GateResult:
        if self.stage is not Stage.HOLDING:
            raise IllegalTransitionError(self.slot_id, self.stage, Stage.FOSSILIZED)
        result = check_gate(Stage.FOSSILIZED, self.stage, self.metrics, self.alpha, self.cfg)
        if result:
            self._enter(Stage.FOSSILIZED)
        return result

    def prune(
        self, speed: AlphaSpeed = AlphaSpeed.INSTANT, curve: AlphaCurve = AlphaCurve.LINEAR, force: bool = False
    ) -> GateResult:
        """Remove the seed: ramp alpha down over `speed` ticks, then PRUNED. `force` (the governor) is instant
        and skips the age and alpha-holding rules."""
        if not self.is_live:
            raise IllegalTransitionError(self.slot_id, self.stage, Stage.PRUNED, "only a live seed can be pruned")
        if not force:
            if self.pruning:
                return _refused("a prune is already ramping alpha down")
            if self.metrics.age < self.cfg.min_prune_age:
                return _refused(f"seed age {self.metrics.age} < min_prune_age {self.cfg.min_prune_age}")
            if not self.alpha.holding:
                return _refused("alpha is still ramping; prune only from HOLD")
        if force or speed.ticks == 0 or self.alpha.alpha == 0.0 or self.stage in (Stage.GERMINATED, Stage.TRAINING):
            self._finish_prune()
            return _OK
        if self.stage is Stage.HOLDING:
            self._enter(Stage.BLENDING)
        for p in self.seed_parameters():
            p.requires_grad_(False)
        self.pruning = True
        self._set_alpha(0.0, speed.ticks, curve)
        return _OK

    def _finish_prune(self) -> None:
        self._enter(Stage.PRUNED)
        self.seed, self.gate, self.optimizer = None, None, None
        self.pruning = False
        self.alpha = AlphaSchedule()
        self.alpha_value.zero_()

    def set_alpha_target(
        self, target: AlphaTarget, speed: AlphaSpeed = AlphaSpeed.INSTANT, curve: AlphaCurve = AlphaCurve.LINEAR
    ) -> GateResult:
        if self.stage not in (Stage.BLENDING, Stage.HOLDING):
            raise IllegalTransitionError(
                self.slot_id, self.stage, Stage.BLENDING, "SET_ALPHA_TARGET needs BLENDING or HOLDING"
            )
        if not self.can_set_alpha_target():
            return _refused("alpha is still ramping (or a prune is running); retarget only from HOLD")
        if self.stage is Stage.HOLDING and target.alpha < 1.0:
            self._enter(Stage.BLENDING)
        self._set_alpha(target.alpha, speed.ticks, curve)
        return _OK

    def step_epoch(self) -> None:
        """One lifecycle tick at the end of an epoch: alpha ramp, ages, cool-down, auto-forward."""
        if self.stage is Stage.PRUNED:
            self._enter(Stage.EMBARGOED)
            self.embargo_left = self.cfg.embargo_epochs
            return
        if self.stage is Stage.EMBARGOED:
            self.embargo_left -= 1
            if self.embargo_left <= 0:
                self._enter(Stage.RESETTING)
            return
        if self.stage is Stage.RESETTING:
            self._enter(Stage.DORMANT)
            self._reset_state()
            return
        if self.stage is Stage.DORMANT:
            return
        self.alpha.step()
        self.alpha_value.fill_(self.alpha.alpha)
        self.metrics.age += 1
        self.metrics.epochs_in_stage += 1
        if self.metrics.epochs_since_contribution is not None:
            self.metrics.epochs_since_contribution += 1
        if self.pruning:
            if self.alpha.holding:
                self._finish_prune()
            return
        if self.cfg.auto_forward and self.stage in _NEXT_BY_ADVANCE:
            self.advance()

    # --------------------------------------------------------------- telemetry
    def observe_accuracy(self, accuracy: float) -> None:
        """The model's validation accuracy this epoch (fraction); gates compare against it."""
        self.last_accuracy = accuracy
        if self.is_live or self.stage is Stage.FOSSILIZED:
            self.metrics.current_accuracy = accuracy

    def gradient_norms(self) -> torch.Tensor | None:
        """Per-parameter gradient norms of the seed, on its device (no host sync); None without gradients."""
        grads = [p.grad for p in self.seed_parameters() if p.grad is not None]
        if not grads:
            return None
        return torch.stack([torch.linalg.vector_norm(g) for g in grads])

    def record_gradient_norms(self, seed_norms: list[float], host_norm: float, host_params: int) -> None:
        """Turn per-parameter norms (already on the host) into the G2 telemetry."""
        n = len(seed_norms)
        seed_norm = math.sqrt(sum(v * v for v in seed_norms))  # inf or nan if any gradient was not finite
        vanishing = sum(v < VANISHING_GRAD_NORM for v in seed_norms) / n
        exploding = sum(not v <= EXPLODING_GRAD_NORM for v in seed_norms) / n  # a NaN gradient counts as exploding
        if not math.isfinite(seed_norm):
            seed_norm = math.inf
        ratio = 0.0
        if math.isfinite(seed_norm) and host_norm > 0 and self.seed_params > 0:
            ratio = min((seed_norm / host_norm) * math.sqrt(host_params / self.seed_params), GRAD_RATIO_CLAMP)
        self.metrics.record_gradients(
            GradientStats(
                seed_norm=seed_norm,
                host_norm=host_norm,
                ratio=ratio,
                health=1.0 - 0.5 * vanishing - 0.8 * exploding,
                has_vanishing=vanishing > 0,
                has_exploding=exploding > 0,
            )
        )
