"""Start an experiment's first trials (its PPO trials, spec.start_order) before Tune creates any later one.

Why: Tune creates every trial of the grid at once and asks Ray for all their placement groups, and Ray places
whichever waiting group fits first when resources free, not the oldest. So when the PPO trials do not all fit at
once, the short baseline trials took the GPU shares a finished PPO trial left and the second wave of PPO trials
waited behind them (text.yaml at 15 rounds on one H200: the baselines started at 4m06s, the last four PPO trials
at 5m13s-5m41s; docs/performance.md). Here a later trial is created only once every lead trial has started (in
Tune's sense: its actor is up and its setup done), so no request of a later trial competes with a lead trial's.
"""

from __future__ import annotations

from typing import Any

from ray.tune.experiment import Trial
from ray.tune.search.basic_variant import BasicVariantGenerator


class LeadTrialsFirst(BasicVariantGenerator):
    """Tune's grid generator, holding back the trials after the first `leads` until each of those has started.

    A resumed run (Tuner.restore) no longer holds: the lead trials it created are Tune's restored ones, not this
    object's, and the count of trials created is kept with the generator's state so none is created twice."""

    def __init__(self, leads: int, max_concurrent: int = 0) -> None:
        if leads < 0:
            raise ValueError(f"leads={leads}: the number of trials to start first, 0 or more")
        super().__init__(max_concurrent=max_concurrent)
        self.leads = leads
        self.created = 0
        self._lead_trials: list[Trial] = []

    def waiting_for_leads(self) -> bool:
        return self.created >= self.leads and any(t.status == Trial.PENDING for t in self._lead_trials)

    def next_trial(self) -> Trial | None:
        if self.waiting_for_leads():
            return None  # Tune asks again at its next step
        trial = super().next_trial()
        if trial is not None:
            if self.created < self.leads:
                self._lead_trials.append(trial)
            self.created += 1
        return trial

    def get_state(self) -> dict[str, Any] | bool:
        state = super().get_state()
        if isinstance(state, dict):
            state.pop("_lead_trials", None)  # Tune's live trial objects: not part of a checkpoint
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self._lead_trials = []

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles its search algorithm with the tuner
        return {**self.__dict__, "_lead_trials": []}
