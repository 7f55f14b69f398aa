"""How many trials of an experiment run at once: what the cluster's CPUs and GPUs fit (issue 33).

Tune starts a trial when its resources are free, so without a cap the cluster itself sets the concurrency: an
experiment file runs unchanged on 2 cores, one GPU or four. `max_concurrent_trials` (file) or
`ab --max-concurrent-trials` (machine) caps it further. This module says what that gives, before the run, from
the cluster's totals (a trial's bundles may still not fit on one node's leftovers; Tune then waits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from esper_ray.formatting import counted

RESOURCES_SHOWN = ("CPU", "GPU")


def fits_at_once(need: Mapping[str, float], have: Mapping[str, float]) -> int:
    """Trials asking `need` (resource -> amount, summed over its bundles) that fit at once in `have`."""
    asked = {k: v for k, v in need.items() if v > 0}
    if not asked:
        raise ValueError(f"a trial must ask for some resource, got {dict(need)}")
    return min(math.floor(have.get(k, 0.0) / v + 1e-9) for k, v in asked.items())


def requests_by_kind(kinds: Mapping[str, str], needs: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Each arm's request (`needs`, by arm) under its kind of trial (`kinds`, by arm: "ppo", "baseline"); arms of
    one kind that ask for different resources are listed apart, named: "ppo (big, small)"."""
    groups: dict[tuple[str, tuple[tuple[str, float], ...]], list[str]] = {}
    for arm, need in needs.items():
        groups.setdefault((kinds[arm], tuple(sorted(need.items()))), []).append(arm)
    kind_counts = [kind for kind, _ in groups]
    return {
        kind if kind_counts.count(kind) == 1 else f"{kind} ({', '.join(arms)})": dict(need)
        for (kind, need), arms in groups.items()
    }


def describe(requests: Mapping[str, Mapping[str, float]], have: Mapping[str, float], cap: int | None) -> str:
    """One line: per kind of trial (e.g. "ppo", "baseline") what it asks and how many fit at once, and the cap."""

    def amounts(resources: Mapping[str, float]) -> str:
        return ", ".join(f"{resources.get(k, 0.0):g} {k}" for k in RESOURCES_SHOWN if resources.get(k, 0.0) > 0)

    kinds = "; ".join(
        f"{counted(fits_at_once(need, have), kind + ' trial')} at once ({amounts(need)} each)"
        for kind, need in requests.items()
    )
    limit = f"capped at {cap} by max_concurrent_trials" if cap is not None else "no cap (max_concurrent_trials not set)"
    return f"trials at once on {amounts(have) or 'no CPUs'}: {kinds}; {limit}"
