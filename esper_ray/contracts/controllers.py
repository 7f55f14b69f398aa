"""Who makes the growth decisions in a run or an A/B arm."""

from __future__ import annotations

from enum import Enum


class ControllerKind(str, Enum):
    PPO = "ppo"
    """The policy trained with PPO (the only kind that trains)."""
    HEURISTIC = "heuristic"
    """The rule-based controller of the original (DOMAIN.md section 12)."""
    NONE = "none"
    """Always WAIT: the host as it is, never grown. The baseline every growth claim is read against."""
    RANDOM = "random"
    """Uniform over the legal values of every head."""

    @classmethod
    def parse(cls, value: object, where: str = "controller") -> ControllerKind:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{where}={value!r}: unknown controller; choose one of {[k.value for k in cls]}") from None
