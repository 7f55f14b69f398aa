"""Numbers as the words of any command's lines: durations, counts with their noun, clock stamps, the time left,
the largest share. Below every layer (nothing here knows of training or experiments), so any layer may use it."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3m05s, 1h02m."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 trial`, `2 trials`: a count and its noun, singular or plural as the count wants."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def clock_stamp(seconds: float) -> str:
    """The time since a command started, as its progress lines begin: `[  3m05s]`."""
    whole = max(0, int(seconds))
    return f"[{whole // 60:3d}m{whole % 60:02d}s]"


def time_left(elapsed: float, done: float, total: float) -> str:
    """`about 3m05s left` at the mean rate so far; empty before anything is done or once everything is."""
    if done <= 0 or done >= total:
        return ""
    return f"about {duration(elapsed / done * (total - done))} left"


def largest_share(values: dict[str, float]) -> tuple[str, float] | None:
    """The key with the largest value and its share of the finite total; None where the total is not positive."""
    finite = {k: v for k, v in values.items() if math.isfinite(v)}
    total = sum(finite.values())
    if not total > 0:
        return None
    key = max(finite, key=lambda k: finite[k])
    return key, finite[key] / total
