"""A MultiDiscrete action space whose `sample()` draws only legal actions while its env is live.

Tools that sample actions without a mask (gymnasium's env checker, a random baseline) then exercise real
decisions instead of tripping the env's masked-action check. The mask provider is dropped when the space is
pickled or copied (RLlib ships spaces to other processes), leaving a plain MultiDiscrete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


class MaskedMultiDiscrete(gym.spaces.MultiDiscrete):
    def __init__(
        self, nvec: list[int], mask_provider: Callable[[], np.ndarray | None] | None = None, seed: int | None = None
    ) -> None:
        super().__init__(nvec, seed=seed)
        self._mask_provider = mask_provider

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        if mask is None and probability is None and self._mask_provider is not None:
            flat = self._mask_provider()
            if flat is not None:
                bounds = np.cumsum(self.nvec)[:-1]
                mask = tuple(part.astype(np.int8) for part in np.split(flat, bounds))
        return super().sample(mask=mask, probability=probability)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mask_provider"] = None
        return state
