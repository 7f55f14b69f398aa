"""Small builders shared by the morpho tests."""

from __future__ import annotations

import torch

from esper_ray.contracts.actions import AlphaTarget, Style, Tempo
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.host import CNNHost, host_preset
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.slot import SeedSlot


def make_model(slots: list[str], preset: str = "digits", seed: int = 0, **lifecycle: object) -> MorphogeneticModel:
    torch.manual_seed(seed)
    return MorphogeneticModel(CNNHost(host_preset(preset)), slots, LifecycleConfig(**lifecycle))  # type: ignore[arg-type]


def give_healthy_gradients(slot: SeedSlot) -> None:
    slot.record_gradient_norms([0.1] * max(1, len(slot.seed_parameters())), host_norm=1.0, host_params=1000)


def drive_to(slot: SeedSlot, stage: Stage, blueprint: str = "conv_light", style: Style = Style.LINEAR_ADD) -> None:
    """Move a DORMANT slot's seed to `stage` through the legal path (auto_forward must be off)."""
    assert slot.stage is Stage.DORMANT, slot.stage
    slot.germinate(blueprint, style=style, tempo=Tempo.FAST, alpha_target=AlphaTarget.FULL)
    path = [Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED]
    for target in path[: path.index(stage) + 1] if stage in path else []:
        if target is Stage.BLENDING:
            for _ in range(slot.cfg.min_training_epochs):
                slot.step_epoch()
            give_healthy_gradients(slot)
        if target is Stage.HOLDING:
            for _ in range(slot.tempo_epochs):
                slot.step_epoch()
        if target is Stage.FOSSILIZED:
            slot.metrics.record_contribution(0.02)
            assert slot.fossilize()
        else:
            assert slot.advance(), f"advance to {target.name} refused"
    assert slot.stage is stage, (slot.stage, stage)


def perturbed_for_eval(model: MorphogeneticModel) -> MorphogeneticModel:
    """Nudge every parameter (zero-initialised layers too, so every seed matters) and switch to eval mode."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def separate_forward(model: MorphogeneticModel, x: torch.Tensor, alphas_row: torch.Tensor) -> torch.Tensor:
    """Reference for fused_forward: set each slot's live alpha to the configuration's value, run the ordinary
    forward, and put the alphas back."""
    saved = [float(s.alpha_value) for s in model.seed_slots()]
    for s, a in zip(model.seed_slots(), alphas_row.tolist()):
        s.alpha_value.fill_(a)
    try:
        return model(x)
    finally:
        for s, a in zip(model.seed_slots(), saved):
            s.alpha_value.fill_(a)
