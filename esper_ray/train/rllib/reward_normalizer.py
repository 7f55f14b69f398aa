"""The original's reward normaliser (DOMAIN.md section 8): rewards divided by a running standard deviation (Welford,
no mean subtraction, so a reward keeps its sign) and clipped at +-10, before GAE.

Why: rewards of the contribution family are in accuracy points and reach +-10 per step once a seed blends, so
returns span 0..100 while most episodes return about 1. Unscaled, the value loss (hundreds) dominated the
shared trunk's gradient and the global-norm clip shrank the policy's part of it a hundredfold.

It is a learner connector piece, so there is one normaliser per learner (not one per env), it sees every
reward of the batch, the env runners' metrics stay in raw reward units, and its statistics are saved with
the learner. It reads `LOSS_MASK` to skip zero-padding and the bootstrap step RLlib appends to each episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.utils.annotations import override

CLIP = 10.0
EPSILON = 1e-8


class RunningStd:
    """Welford's running variance over every value seen (Chan et al.'s parallel update for batches).

    Not RLlib's RunningStat (policy/feature_filter.py's): that one takes one value per push, gives the sample
    variance (n - 1) cast to float32, and 0 until two values are seen, which would divide the first rewards by
    EPSILON. This one is the population std (numpy's np.std) in float64, 1 until two values are seen; its state
    is three numbers, saved with the learner (the shipped controllers hold only the policy and its filter)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        if len(values) == 0:
            return
        n, mean = len(values), float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.count)) if self.count > 1 else 1.0

    def get_state(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def set_state(self, state: dict[str, float]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


class RewardStdNormalizer(ConnectorV2):
    """Learner connector piece, placed just before GAE: REWARDS <- clip(REWARDS / running std, +-10)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.running = RunningStd()

    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[str, Any],
        episodes: Any,
        explore: Any = None,
        shared_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        for module_batch in batch.values():
            if Columns.REWARDS not in module_batch:
                continue
            rewards = module_batch[Columns.REWARDS]
            mask = module_batch[Columns.LOSS_MASK]
            self.running.update(torch.as_tensor(rewards)[torch.as_tensor(mask).bool()].cpu().numpy())
            module_batch[Columns.REWARDS] = (rewards / max(self.running.std, EPSILON)).clamp(-CLIP, CLIP)
        return batch

    @override(ConnectorV2)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        return self.running.get_state()

    @override(ConnectorV2)
    def set_state(self, state: dict[str, Any]) -> None:
        self.running.set_state(state)
