"""The governor: watches each epoch's validation loss and rolls the model back to its last good snapshot.

Rules (DOMAIN.md section 11): a NaN/Inf loss rolls back at once; a "lobotomy" (a trained model suddenly at
the loss of a uniform guess) rolls back at once; a statistical spike (above an absolute floor, 6 sigma and
3x the recent mean) rolls back after 3 in a row. Anomalous losses stay out of the history. Snapshots hold
the host and fossilized seeds (the rest is experimental and pruned on rollback), on the CPU.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import torch

from esper_ray.contracts.stages import Stage
from esper_ray.morpho.model import MorphogeneticModel

SNAPSHOT_EVERY = 5


@dataclass(frozen=True)
class GovernorConfig:
    history: int = 20
    min_history: int = 10
    absolute_threshold: float = 12.0
    sigma_multiplier: float = 6.0
    mean_multiplier: float = 3.0
    consecutive_panics: int = 3
    lobotomy_mean_fraction: float = 0.6
    lobotomy_tolerance: float = 0.065


@dataclass(frozen=True)
class Verdict:
    rollback: bool
    reason: str = ""


class Governor:
    def __init__(self, random_guess_loss: float, cfg: GovernorConfig | None = None) -> None:
        self.random_guess_loss = random_guess_loss
        self.cfg = cfg or GovernorConfig()
        self.losses: deque[float] = deque(maxlen=self.cfg.history)
        self.panics = 0
        self.snapshot_epoch: int | None = None
        self._host_state: dict[str, torch.Tensor] = {}
        self._fossil_states: dict[str, dict[str, torch.Tensor]] = {}

    def check(self, val_loss: float) -> Verdict:
        """Judge this epoch's validation loss; a loss that is not an anomaly joins the history."""
        cfg = self.cfg
        if not math.isfinite(val_loss):
            return Verdict(True, "nan")
        guess = self.random_guess_loss
        if len(self.losses) >= cfg.min_history:
            mean = statistics.fmean(self.losses)
            if mean < cfg.lobotomy_mean_fraction * guess and abs(val_loss - guess) < cfg.lobotomy_tolerance * guess:
                return Verdict(True, "lobotomy")
            std = statistics.pstdev(self.losses)
            if (
                val_loss > cfg.absolute_threshold
                and val_loss > mean + cfg.sigma_multiplier * std
                and val_loss > cfg.mean_multiplier * mean
            ):
                self.panics += 1
                if self.panics >= cfg.consecutive_panics:
                    return Verdict(True, "divergence")
                return Verdict(False, "spike")
        self.panics = 0
        self.losses.append(val_loss)
        return Verdict(False)

    def snapshot(self, model: MorphogeneticModel, epoch: int) -> None:
        self._host_state = {k: v.detach().to("cpu", copy=True) for k, v in model.host.state_dict().items()}
        self._fossil_states = {
            s.slot_id: {k: v.detach().to("cpu", copy=True) for k, v in s.state_dict().items()}
            for s in model.seed_slots()
            if s.stage is Stage.FOSSILIZED
        }
        self.snapshot_epoch = epoch

    def restore(self, model: MorphogeneticModel) -> None:
        """Load the snapshot's weights and force-prune every live seed."""
        if self.snapshot_epoch is None:
            raise RuntimeError("governor has no snapshot to roll back to")
        model.host.load_state_dict(self._host_state, strict=True)
        for slot in model.seed_slots():
            if slot.slot_id in self._fossil_states:
                slot.load_state_dict(self._fossil_states[slot.slot_id], strict=True)
            elif slot.is_live:
                slot.prune(force=True)
        self.losses.clear()
        self.panics = 0
