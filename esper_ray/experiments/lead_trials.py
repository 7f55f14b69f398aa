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

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.search.basic_variant import BasicVariantGenerator


class LeadTrialsFirst(BasicVariantGenerator):
    """Tune's grid generator, holding back the trials after the first `leads` until each of those has started.

    A resumed run (Tuner.restore) holds too: the generator's state keeps the count of trials created (so none is
    created twice) and the lead trials' ids, and ShowTrials hands it Tune's restored trials, among which it finds
    its leads again."""

    def __init__(self, leads: int, max_concurrent: int = 0) -> None:
        if leads < 0:
            raise ValueError(f"leads={leads}: the number of trials to start first, 0 or more")
        super().__init__(max_concurrent=max_concurrent)
        self.leads = leads
        self.created = 0
        self._lead_ids: list[str] = []
        self._lead_trials: list[Trial] = []

    def find_leads(self, trials: list[Trial]) -> None:
        """After a resume: take the lead trials from Tune's (restored) `trials`; a no-op once it holds them."""
        if len(self._lead_trials) < len(self._lead_ids):
            self._lead_trials = [t for t in trials if t.trial_id in self._lead_ids]

    def waiting_for_leads(self) -> bool:
        return self.created >= self.leads and any(t.status == Trial.PENDING for t in self._lead_trials)

    def next_trial(self) -> Trial | None:
        if self.waiting_for_leads():
            return None  # Tune asks again at its next step
        trial = super().next_trial()
        if trial is not None:
            if self.created < self.leads:
                self._lead_ids.append(trial.trial_id)
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
        self._lead_trials = []  # found again among Tune's restored trials (find_leads)

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles its search algorithm with the tuner
        return {**self.__dict__, "_lead_trials": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_lead_ids": [], **state})  # runs pickled before the ids were kept hold nothing back


class ShowTrials(tune.Callback):
    """Shows Tune's trials to a LeadTrialsFirst at the start of every step of Tune's loop, before Tune asks it for
    a trial: after a resume, that is how it finds its restored lead trials. Tune pickles the two together with the
    tuner, so a resumed run's callback still holds its generator."""

    def __init__(self, generator: LeadTrialsFirst) -> None:
        self.generator = generator

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self.generator.find_leads(trials)
