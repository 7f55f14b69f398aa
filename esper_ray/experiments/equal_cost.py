"""An experiment at equal cost (`host_runs: K` beside `held_out:`): every arm spends K host runs per held-out host and
keeps the network its own validation score picks.

Run i of every arm is evaluation episode i (reset seed EVAL_SEED_STRIDE * (seed + 1) + i): the same host
initialisation and data order in every arm, so run i is paired across arms. A controller (frozen, rules, a fixed
plan, no growth) grows a network on each of the K episodes; a search runs its i-th candidate on episode i. Each run
records its validation score (the metric on the validation split, what a search ranks by) and its test score (the
metric on the test split, of the committed model), and a search's run its plan. The score of an arm at k host runs
is the test score of the run with the best validation among its first k (score_at): any k up to K is recomputed
from the runs results.json keeps, so one run of K gives every k (the report reads k = 1, 2, 4, ..., K).

This module is data only (no Ray): the trial writes the runs (trainable.py), the report reads them back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

RUNS = "runs"
"""Per held-out host, a trial's host runs: `eval/runs/<host>` in its result (a JSON string: every Tune logger takes
it), `runs` per trial in results.json."""
EPISODE_SEED, VALIDATION, TEST, PLAN = "episode_seed", "validation", "test", "plan"
"""The fields of one host run's record (PLAN only for a search's runs)."""


def run_record(episode_seed: int, validation: float, test: float, plan: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {EPISODE_SEED: int(episode_seed), VALIDATION: float(validation), TEST: float(test)}
    if plan is not None:
        record[PLAN] = plan
    return record


def score_at(runs: Sequence[Mapping[str, Any]], k: int) -> float:
    """The test score of the run with the best validation among the first k (the first of equals; a run whose
    validation is not a number never wins); NaN when none of them has one. With fewer than k runs (a search that
    ran out of candidates) all of them."""
    if k < 1:
        raise ValueError(f"k={k}: must be >= 1 (host runs per host)")
    best, best_validation = math.nan, -math.inf
    for run in runs[:k]:
        validation = _number(run.get(VALIDATION))
        if math.isfinite(validation) and validation > best_validation:
            best, best_validation = _number(run.get(TEST)), validation
    return best


def ks_of(host_runs: int) -> list[int]:
    """The k's the report reads: the powers of 2 up to host_runs, and host_runs itself (1, 2, 4, 8, 16 for 16)."""
    out = [2**i for i in range(host_runs.bit_length()) if 2**i <= host_runs]
    return out if out[-1] == host_runs else [*out, host_runs]


def runs_json(runs: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps([dict(r) for r in runs])


def runs_from_json(value: Any) -> list[dict[str, Any]] | None:
    """A trial result's `eval/runs/<host>` back as records; None when it is not such a list (a damaged folder)."""
    if not isinstance(value, str):
        return None
    try:
        runs = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        return None
    return [
        {
            k: (_number(v) if k in (VALIDATION, TEST) else v)
            for k, v in r.items()
            if k in (EPISODE_SEED, VALIDATION, TEST, PLAN)
        }
        for r in runs
    ]


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
