"""The `search` arm: per host, a search over fixed plans (one blueprint in one slot), what a user would run on a
new host instead of a learned controller.

    search: {budget: 16, algorithm: random}

The candidates are every blueprint the host's topology offers in every slot it has (7 CNN blueprints x 3 slots =
21 on the digits hosts). A Ray Tune search algorithm, used in-process through Tune's Searcher interface
(suggest / on_trial_complete), proposes `budget` of them; each is run once, as the `fixed` controller runs it, on
one search episode of the host (the same host initialisation and data order for every candidate, and none of
the evaluation episodes') and scored on its VALIDATION split; the best by validation is then evaluated on the
test split over the trial's evaluation episodes. Cost per new host: budget + eval_episodes host runs.

`random` is Tune's random search (a `tune.choice` over the candidates, drawn with a seeded RNG), each candidate
at most once: a plan run twice on the same episode scores the same, so a repeat would spend a host run on
nothing. With a budget at least the number of candidates, every candidate runs once (a grid).

`tpe` is Tune's OptunaSearch with Optuna's TPE sampler (seeded), over the candidate's index as a categorical: what a
user would pick beside random (the optional extra `optuna`). A TPE may propose a candidate it has already had; that
candidate is not run again (no host run spent): its known validation score is told back to the searcher, which is
asked again (run_search), so each candidate still runs at most once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray import tune
from ray.tune.search import Searcher

from esper_ray.contracts.actions import topology_blueprints
from esper_ray.contracts.controllers import FixedPlan, FixedSeed
from esper_ray.experiments.search_settings import ALGORITHMS, SearchSettings

SEARCH_EPISODE_OFFSET = 500_000
"""A search episode's reset seed: the evaluation episodes' base for the seed plus this (they use base + i, i below
100,000), so it is none of theirs and none of training's (small seeds)."""
PLAN_KEY = "plan"


def candidate_plans(topology: str, slots: Sequence[str]) -> list[FixedPlan]:
    """Every single-seed plan a host offers: each blueprint of its topology in each of its slots, slot-major."""
    return [FixedPlan((FixedSeed(blueprint, slot),)) for slot in slots for blueprint in topology_blueprints(topology)]


class RandomPlanSearch(Searcher):
    """Tune's random search over the candidates' indices (`tune.choice`), seeded; each candidate at most once.
    suggest() returns None once every candidate has been proposed."""

    def __init__(self, candidates: int, seed: int) -> None:
        super().__init__(metric="validation", mode="max")
        self.domain = tune.choice(list(range(candidates)))
        self.rng = np.random.default_rng(seed)
        self.proposed: set[int] = set()
        self.candidates = candidates

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if len(self.proposed) >= self.candidates:
            return None
        while True:
            index = int(self.domain.sample(random_state=self.rng))
            if index not in self.proposed:
                self.proposed.add(index)
                return {PLAN_KEY: index}

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        pass  # random search learns nothing from a result; run_search keeps the best


def tpe_search(candidates: int, seed: int) -> Searcher:
    """Tune's OptunaSearch with a seeded TPE sampler over the candidates' indices (a categorical)."""
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per candidate otherwise
    space = OptunaSearch.convert_search_space({PLAN_KEY: tune.choice(list(range(candidates)))})
    return OptunaSearch(space, metric="validation", mode="max", sampler=optuna.samplers.TPESampler(seed=seed))


def make_searcher(settings: SearchSettings, candidates: int, seed: int) -> Searcher:
    if settings.algorithm == "random":
        return RandomPlanSearch(candidates, seed)
    if settings.algorithm == "tpe":
        return tpe_search(candidates, seed)
    raise ValueError(f"algorithm={settings.algorithm!r}: choose one of {list(ALGORITHMS)}")


@dataclass(frozen=True)
class SearchOutcome:
    best: FixedPlan
    best_score: float
    tried: list[tuple[FixedPlan, float]]
    """Each candidate run, in the order tried, with its validation score."""
    repeats: int = 0
    """Proposals of a candidate already run, answered with its known score (no host run spent)."""

    @property
    def runs(self) -> int:
        return len(self.tried)


MAX_REPEATS = 1_000
"""Proposals of candidates already run that a search may make in a row before it stops short of its budget (a TPE
sure of its best; each is answered at once, without a host run)."""


def run_search(
    searcher: Searcher, candidates: Sequence[FixedPlan], budget: int, score: Callable[[FixedPlan], float]
) -> SearchOutcome:
    """Ask `searcher` for up to `budget` candidates, score each once (`score`: its validation metric, one host run),
    report it back, and return the best by validation (the first tried among equals; a NaN score never wins).
    A candidate proposed again is not run: its known score is reported back and the searcher asked again (up to
    MAX_REPEATS times in a row; then the search ends with the candidates run so far)."""
    tried: list[tuple[FixedPlan, float]] = []
    known: dict[int, float] = {}
    asked = repeats = in_a_row = 0
    while len(tried) < budget and in_a_row <= MAX_REPEATS:
        trial_id = f"candidate{asked}"
        asked += 1
        config = searcher.suggest(trial_id)
        if config is None:  # every candidate tried
            break
        index = int(config[PLAN_KEY])
        if index in known:
            repeats, in_a_row = repeats + 1, in_a_row + 1
            _tell(searcher, trial_id, index, known[index])
            continue
        in_a_row = 0
        plan = candidates[index]
        value = known[index] = float(score(plan))
        _tell(searcher, trial_id, index, value)
        tried.append((plan, value))
    scored = [(p, v) for p, v in tried if math.isfinite(v)]
    if not scored:
        raise RuntimeError(f"search: none of the {len(tried)} candidates tried has a finite validation score")
    best, best_score = max(scored, key=lambda pv: pv[1])  # max keeps the first of equals
    return SearchOutcome(best, best_score, tried, repeats)


def _tell(searcher: Searcher, trial_id: str, index: int, value: float) -> None:
    """A candidate's score back to the searcher; a NaN one (a diverged run) as a failed trial (Optuna takes no NaN)."""
    if math.isfinite(value):
        searcher.on_trial_complete(trial_id, {searcher.metric: value, PLAN_KEY: index})
    else:
        searcher.on_trial_complete(trial_id, None, error=True)
