"""The heuristic controller (DOMAIN.md section 12), reading the same observation and mask as the policy.

Germinate when the host has stabilised and plateaued and no seed is alive; advance seeds when the
lifecycle needs a push (only when auto-forward is off); prune a seed whose stage made accuracy fall by 2 pp;
fossilize a holding seed whose counterfactual contribution exceeds 0.5 pp, otherwise prune it.
Blueprints rotate, skipping those recently pruned (penalty +2 per prune, halved every epoch, skip at >= 3).

Scaled to the run (issue 30). The original's numbers are for its own runs of 75 epochs (its heuristic's default;
its RL episodes were 150): min_epoch 5, 3 stable and 3 flat epochs, a 5-epoch embargo and prune patience, and
per-epoch thresholds (0.5 pp of accuracy, a -5 %..+3 % loss change). In a run of `max_epochs` they scale by
max_epochs / 75: epoch counts shrink with it (at least 1) and per-epoch thresholds grow by its inverse, since a
run three times shorter changes three times as much an epoch. And a seed is planted only while its lifecycle can
still end before the run does (10 epochs of TRAINING, the blend, one epoch in HOLDING to decide): a seed still on
probation at the end is dropped (docs/design.md), so planting it later only costs. Measured on digits-impaired
(25 epochs, 4 episodes): unscaled, the heuristic planted at epochs 6, 10, 12 and 25 and fossilized none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from esper_ray.contracts.actions import Blueprint, Op, Tempo, topology_blueprints
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import COOLDOWN_STAGES, LIVE_STAGES, Stage
from esper_ray.env.masks import allows
from esper_ray.env.observation import (
    BASE_EPOCH,
    BASE_VAL_ACCURACY,
    BASE_VAL_LOSS,
    SLOT_ALPHA,
    SLOT_EPOCHS_IN_STAGE,
    SLOT_FEATURES,
    blueprint_of,
    decode_contribution,
    decode_stage,
    slot_offset,
)
from esper_ray.policy.baselines import lifecycle_action

TEMPO = Tempo.STANDARD
"""The ramp every seed the heuristic plants takes (the original's default)."""

DEFAULT_ROTATION = (
    Blueprint.CONV_LIGHT,
    Blueprint.CONV_HEAVY,
    Blueprint.ATTENTION,
    Blueprint.NORM,
    Blueprint.DEPTHWISE,
)
# On a transformer host: the original's rotation less the blueprints a transformer cannot take (attention, norm),
# then the transformer-only ones. A 25-epoch run has room for one lifecycle, so the first blueprint is the one
# tried; with the cheap adapters first (as before issue 30) it was lora, pruned on text-starved every time.
TRANSFORMER_ROTATION = (Blueprint.ATTENTION, Blueprint.NORM, Blueprint.LORA, Blueprint.MLP_SMALL, Blueprint.LORA_LARGE)
# On a vector host (an MLP), the MLP seeds first: they add capacity where a feature gate or a norm only rescales.
VECTOR_ROTATION = (Blueprint.MLP_SMALL, Blueprint.MLP, Blueprint.ATTENTION, Blueprint.NORM, Blueprint.LORA)
DEFAULT_ROTATIONS = {"cnn": DEFAULT_ROTATION, "transformer": TRANSFORMER_ROTATION, "vector": VECTOR_ROTATION}
# Plateau thresholds (fraction of validation accuracy gained in an epoch). The original's 0.5 pp is for images.
# A byte-level language model's per-token accuracy keeps climbing by 0.4-1.7 pp an epoch for dozens of epochs
# (the `text` host, 120 KB, epochs 5-13 of 25: measured), so at 0.5 pp the heuristic germinated 0-1 seeds in
# 40-epoch episodes (issue 19); 1 pp per token lets it see the slow climb as the plateau it is.
DEFAULT_PLATEAU_THRESHOLDS = {"cnn": 0.005, "transformer": 0.01, "vector": 0.005}


ORIGINAL_RUN_EPOCHS = 75
"""Length of the runs the original's heuristic numbers were made for (its `heuristic` command's default)."""


@dataclass(frozen=True)
class HeuristicConfig:
    min_epoch: int = 5
    """No germination before this epoch."""
    plateau_threshold: float | None = None
    """An epoch whose accuracy gain is below this (fraction) counts towards a plateau; None takes the host
    topology's (0.5 pp on a CNN, 1 pp per token on a transformer)."""
    plateau_epochs: int = 3
    stable_epochs: int = 3
    """Consecutive epochs of small relative loss change that latch "host stabilised"."""
    embargo_epochs: int = 5
    """Epochs after a prune before germinating again."""
    prune_drop: float = 0.02
    """Prune a TRAINING/BLENDING seed whose stage lost this much accuracy (fraction; 2 pp)..."""
    prune_patience: int = 5
    """...after at least this many epochs in the stage."""
    fossilize_contribution: float = 0.005
    """Fossilize a holding seed contributing more than this (fraction; 0.5 pp)."""
    ransomware_contribution: float = 0.001
    rotation: tuple[Blueprint, ...] | None = None
    """Blueprints to germinate in turn; None takes the host topology's default."""
    penalty_per_prune: float = 2.0
    penalty_skip: float = 3.0
    stable_band: tuple[float, float] = (-0.05, 0.03)
    """An epoch whose relative loss improvement lies in this band counts towards "stabilised"."""
    reference_epochs: int | None = ORIGINAL_RUN_EPOCHS
    """Run length the numbers above are meant for; a run of another length scales them (see the module's
    docstring). None: use them as given."""
    lifecycle_epochs: int = LifecycleConfig().commit_steps(TEMPO)
    """Steps from germination to the first step a seed can be fossilized, at the heuristic's STANDARD tempo (16
    with the default lifecycle: 10 in TRAINING, a 5-epoch blend, one in HOLDING); no seed is planted that could not
    be fossilized by the last step (with the observation's epoch e, the step is e + 1: in a 25-epoch run the last
    epoch it plants at is 25 - 16 - 1 = 8). 0: no deadline."""

    @classmethod
    def for_lifecycle(cls, lifecycle: LifecycleConfig) -> HeuristicConfig:
        """The defaults with the planting deadline of the env's own lifecycle (its min_training_epochs,
        auto_forward)."""
        return cls(lifecycle_epochs=lifecycle.commit_steps(TEMPO))

    def __post_init__(self) -> None:
        if self.rotation is not None and not self.rotation:
            raise ValueError("rotation: needs at least one blueprint")
        if self.reference_epochs is not None and self.reference_epochs < 1:
            raise ValueError(
                f"reference_epochs={self.reference_epochs}: must be >= 1 (or None to use the numbers as given)"
            )

    def scaled_to(self, max_epochs: int) -> HeuristicConfig:
        """These settings for a run of `max_epochs` (module docstring); unchanged when reference_epochs is None."""
        if self.reference_epochs is None:
            return self
        scale = max_epochs / self.reference_epochs

        def epochs(n: int) -> int:
            return max(1, round(n * scale))

        low, high = self.stable_band
        return dataclasses.replace(
            self,
            min_epoch=epochs(self.min_epoch),
            plateau_epochs=epochs(self.plateau_epochs),
            stable_epochs=epochs(self.stable_epochs),
            embargo_epochs=epochs(self.embargo_epochs),
            prune_patience=epochs(self.prune_patience),
            stable_band=(low / scale, high / scale),
            plateau_threshold=None if self.plateau_threshold is None else self.plateau_threshold / scale,
            reference_epochs=None,
        )

    def rotation_for(self, topology: str) -> tuple[Blueprint, ...]:
        """The rotation to use on a host of this topology; ValueError if it names blueprints the host cannot take."""
        rotation = self.rotation if self.rotation is not None else DEFAULT_ROTATIONS[topology]
        fits = topology_blueprints(topology)
        bad = [b for b in rotation if b not in fits]
        if bad:
            raise ValueError(
                f"rotation: {[b.key for b in bad]} are not {topology} blueprints; choose from {[b.key for b in fits]}"
            )
        return rotation


@dataclass
class _SlotTrack:
    stage: Stage = Stage.DORMANT
    blueprint: Blueprint | None = None
    accuracy_at_germination: float = 0.0
    accuracy_at_stage_start: float = 0.0


@dataclass
class _Tracker:
    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    stable_run: int = 0
    stabilised: bool = False
    plateau_run: int = 0
    last_prune_epoch: int | None = None
    penalties: dict[Blueprint, float] = field(default_factory=dict)
    rotation_index: int = 0
    slots: list[_SlotTrack] = field(default_factory=list)


class HeuristicController:
    def __init__(
        self, slot_ids: Sequence[str], max_epochs: int, cfg: HeuristicConfig | None = None, topology: str = "cnn"
    ) -> None:
        self.slot_ids = list(slot_ids)
        self.max_epochs = max_epochs
        given = cfg or HeuristicConfig()
        if given.plateau_threshold is None:
            given = dataclasses.replace(given, plateau_threshold=DEFAULT_PLATEAU_THRESHOLDS[topology])
        self.cfg = given.scaled_to(max_epochs)
        self.rotation = self.cfg.rotation_for(topology)
        self.reset()

    def reset(self) -> None:
        self.t = _Tracker(slots=[_SlotTrack() for _ in self.slot_ids])

    # ---------------------------------------------------------------- tracking
    def _observe(self, features: np.ndarray, blueprints: np.ndarray) -> tuple[int, float]:
        cfg, t = self.cfg, self.t
        epoch = int(round(float(features[BASE_EPOCH]) * self.max_epochs))
        scaled = float(features[BASE_VAL_LOSS]) * 7.0
        loss = math.copysign(math.expm1(abs(scaled)), scaled)
        accuracy = float(features[BASE_VAL_ACCURACY])
        if t.losses:
            change = (t.losses[-1] - loss) / max(t.losses[-1], 1e-8)
            low, high = cfg.stable_band
            t.stable_run = t.stable_run + 1 if low < change < high else 0
            t.stabilised = t.stabilised or t.stable_run >= cfg.stable_epochs
            gain = accuracy - t.accuracies[-1]
            t.plateau_run = t.plateau_run + 1 if gain < cfg.plateau_threshold else 0  # type: ignore[operator]
        t.losses.append(loss)
        t.accuracies.append(accuracy)
        t.penalties = {b: p * 0.5 for b, p in t.penalties.items() if p * 0.5 >= 0.1}
        for i, track in enumerate(t.slots):
            stage = decode_stage(features[slot_offset(i) : slot_offset(i) + SLOT_FEATURES])
            if stage is not track.stage:
                if track.stage is Stage.DORMANT and stage in LIVE_STAGES:
                    track.accuracy_at_germination = accuracy
                    track.blueprint = blueprint_of(int(blueprints[i]))
                if stage in COOLDOWN_STAGES and track.stage in LIVE_STAGES:
                    t.last_prune_epoch = epoch
                    if track.blueprint is not None:
                        t.penalties[track.blueprint] = t.penalties.get(track.blueprint, 0.0) + cfg.penalty_per_prune
                track.stage, track.accuracy_at_stage_start = stage, accuracy
        return epoch, accuracy

    # ---------------------------------------------------------------- deciding
    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        features, mask = obs["features"], obs["action_mask"]
        epoch, accuracy = self._observe(features, obs["blueprint_ids"])
        n = len(self.slot_ids)

        def legal(op: Op, i: int) -> bool:
            return allows(mask, op, i, TEMPO)

        for i, track in enumerate(self.t.slots):
            block = features[slot_offset(i) : slot_offset(i) + SLOT_FEATURES]
            op = self._decide_for_seed(track, block, accuracy)
            if op is not None and legal(op, i):
                return self._action(op, i)
        if self._wants_germination(epoch):
            blueprint = self._next_blueprint()
            for i in range(n):
                if blueprint is not None and legal(Op.GERMINATE, i):
                    self.t.rotation_index += 1
                    return self._action(Op.GERMINATE, i, blueprint)
        return self._action(Op.WAIT, None)

    def _decide_for_seed(self, track: _SlotTrack, block: np.ndarray, accuracy: float) -> Op | None:
        cfg = self.cfg
        stage = track.stage
        if stage is Stage.GERMINATED:
            return Op.ADVANCE
        if stage in (Stage.TRAINING, Stage.BLENDING):
            epochs_in_stage = round(float(block[SLOT_EPOCHS_IN_STAGE]) * self.max_epochs)  # k / max_epochs in float32
            if epochs_in_stage >= cfg.prune_patience and accuracy - track.accuracy_at_stage_start < -cfg.prune_drop:
                return Op.PRUNE
            if stage is Stage.TRAINING or float(block[SLOT_ALPHA]) >= 1.0:
                return Op.ADVANCE
            return None
        if stage is Stage.HOLDING:
            contribution = decode_contribution(block)
            if contribution is None:
                return None
            if contribution > cfg.ransomware_contribution and accuracy - track.accuracy_at_germination < 0:
                return Op.PRUNE
            return Op.FOSSILIZE if contribution > cfg.fossilize_contribution else Op.PRUNE
        return None

    def _wants_germination(self, epoch: int) -> bool:
        cfg, t = self.cfg, self.t
        if any(s.stage in LIVE_STAGES for s in t.slots):
            return False
        if t.last_prune_epoch is not None and epoch - t.last_prune_epoch < cfg.embargo_epochs:
            return False
        # a seed that could not be fossilized by the last step would still be on probation at the end, and dropped
        if cfg.lifecycle_epochs and not LifecycleConfig.commits_in_time(epoch, cfg.lifecycle_epochs, self.max_epochs):
            return False
        return t.stabilised and epoch >= cfg.min_epoch and t.plateau_run >= cfg.plateau_epochs

    def _next_blueprint(self) -> Blueprint | None:
        rotation = self.rotation
        for k in range(len(rotation)):
            candidate = rotation[(self.t.rotation_index + k) % len(rotation)]
            if self.t.penalties.get(candidate, 0.0) < self.cfg.penalty_skip:
                self.t.rotation_index += k
                return candidate
        return None

    def _action(self, op: Op, slot_index: int | None, blueprint: Blueprint = Blueprint.CONV_LIGHT) -> np.ndarray:
        return lifecycle_action(op, slot_index, blueprint=blueprint, tempo=TEMPO)
