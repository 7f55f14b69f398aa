"""PPO whose learner trains on one round's episodes while the env runners sample the next (`overlap: true`).

RLlib's PPO samples, then updates, then syncs weights, so every round the env runners wait for the learner
(about 1 s a round on a GPU: 10 % of a 4-env, 20-epoch round). Here round k samples with the weights the
runners hold while the learner, at the same moment, trains on round k-1's batch; its new weights reach the
runners when both are done. The runners therefore act one update behind: round k's episodes come from the
weights learned on round k-2's batch. PPO's ratio divides by the log-probabilities stored with the episodes
(the policy that acted), so the update stays a correct clipped surrogate; its first pass just starts with
ratios away from 1, as in APPO without V-trace. It changes what is learned, so it is off by default.

A round's learner metrics (losses, entropies, KL, explained variance) describe the update on the previous
round's batch. A save first learns from the pending batch, so a checkpoint holds no unlearned episodes and a
resume from it replays the rounds an uninterrupted run makes: the round after any save has nothing to learn
while it samples.

It pays where the learner has a GPU share or cores of its own (H100, 4 envs: 0.91 -> 0.958 of the envs' bare
speed); on 2 CPU cores the update only moves from between the rounds into them (0.580 -> 0.584).

With a lead plan (TrainConfig.lead, `plan_leads`) each env runner also starts round k+1 as soon as it is done
with round k (train/rllib/env_runner.py, `sample_round`), with the state sent after round k-1: the rounds then act two
updates behind. No runner leads into the round after a save or past the last round, so a resume from a save
samples what the uninterrupted run sampled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.rllib.algorithms.ppo import PPO
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE
from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    TIMERS,
    WEIGHTS_SEQ_NO,
)

from esper_ray.contracts import metrics as m
from esper_ray.train.process.background import InBackground

UPDATE_HIDDEN_TIMER = "learner_update_hidden_timer"
"""Seconds of this round's learner update that ran while the env runners sampled (0 when nothing was pending)."""


@dataclass(frozen=True)
class LeadPlan:
    """Which rounds the env runners may start before the driver asks: every round but the one after a save."""

    rounds: int
    checkpoint_every: int

    def lead_after(self, round_: int) -> int | None:
        """The round a runner starts once done with `round_`, or None: none after the last round or a save."""
        if round_ >= self.rounds or (self.checkpoint_every and round_ % self.checkpoint_every == 0):
            return None
        return round_ + 1


class OverlappedPPO(PPO):
    """RLlib's PPO (new API stack) with the learner update of round k-1 run during round k's sampling."""

    def setup(self, config: Any) -> None:
        self._pending: list[Any] = []
        """Episodes sampled in the last round, not yet learned from."""
        self._lead_plan: LeadPlan | None = None
        super().setup(config)

    def plan_leads(self, rounds: int, checkpoint_every: int) -> None:
        """Let the env runners start each next round on their own (TrainConfig.lead): a run of `rounds` rounds that
        saves every `checkpoint_every` (0: only at its end)."""
        self._lead_plan = LeadPlan(rounds, checkpoint_every)

    def training_step(self) -> None:
        pending, self._pending = self._pending, []  # taken before the update starts: an interrupted one is never redone
        started = time.perf_counter()
        sampling = InBackground(self._sample, "esper-ray-sample")  # the only thread talking to the runners until done
        update_seconds = 0.0
        weights = None
        if pending:
            # the new weights are fetched from the learner while the runners still sample; only the send is left
            weights = self._learned_weights(self._update(pending))
            update_seconds = time.perf_counter() - started
        episodes, env_runner_results = sampling.result()
        sample_seconds = sampling.finished_at - started
        self.metrics.log_value((TIMERS, ENV_RUNNER_SAMPLING_TIMER), sample_seconds)
        self.metrics.log_value((TIMERS, LEARNER_UPDATE_TIMER), update_seconds)
        # this round's, not an average: both started together, so the shorter of the two ran side by side
        self.metrics.log_value((TIMERS, UPDATE_HIDDEN_TIMER), min(update_seconds, sample_seconds), window=1)
        self.metrics.log_value(m.DRIVER_SAMPLING_SECONDS, sample_seconds, window=1)
        sent = time.perf_counter()
        if weights is not None:
            self._send_weights(weights)
        self.metrics.log_value(m.DRIVER_WEIGHT_SYNC_SECONDS, time.perf_counter() - sent, window=1)
        if episodes:
            self.metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)
            self._pending = episodes

    def learn_pending(self) -> None:
        """Train on the batch the last round sampled, if it is still waiting (before a save or an evaluation)."""
        pending, self._pending = self._pending, []
        if pending:
            self._send_weights(self._learned_weights(self._update(pending)))

    def save_to_path(self, *args: Any, **kwargs: Any) -> str:
        self.learn_pending()
        return super().save_to_path(*args, **kwargs)

    # ------------------------------------------------------------------ PPO.training_step's parts
    def _sample(self) -> tuple[list[Any], list[dict[str, Any]]]:
        if self._lead_plan is not None:
            lead_round = self._lead_plan.lead_after(self.iteration + 1)  # this round is iteration + 1
            results = self.env_runner_group.foreach_env_runner(
                lambda runner: runner.sample_round(lead_round),
                local_env_runner=False,
                timeout_seconds=self.config.sample_timeout_s,
            )
            return [episode for episodes, _ in results for episode in episodes], [metrics for _, metrics in results]
        return synchronous_parallel_sample(
            worker_set=self.env_runner_group,
            max_env_steps=self.config.total_train_batch_size,
            sample_timeout_s=self.config.sample_timeout_s,
            _uses_new_env_runners=True,
            _return_metrics=True,
        )

    def _update(self, episodes: list[Any]) -> set[str]:
        """One PPO update on `episodes`; returns the ids of the modules it trained."""
        learner_results = self.learner_group.update(
            episodes=episodes,
            timesteps={
                NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                    (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                ),
                NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                    (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), default=0
                ),
            },
            num_epochs=self.config.num_epochs,
            minibatch_size=self.config.minibatch_size,
            shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
        )
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return set(learner_results[0].keys()) - {ALL_MODULES}

    def _learned_weights(self, modules: set[str]) -> Any:
        """The learner's inference weights of `modules` (and their sequence number) in the object store: what
        RLlib's EnvRunnerGroup.sync_weights fetches, taken here apart from the send so that it can run while the
        runners sample (a round trip to the learner actor the runners would otherwise wait for)."""
        components = [f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{module}" for module in sorted(modules)]
        state = self.learner_group.get_state(components=components, inference_only=True)[COMPONENT_LEARNER]
        return ray.put({k: v for k, v in state.items() if k in (COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO)})

    def _send_weights(self, weights: Any) -> None:
        """Hand `weights` (from _learned_weights) to every remote env runner, as RLlib's sync_weights does.

        RLlib sends them fire-and-forget and skips a runner whose previous set_state call is unanswered (one
        request in flight per runner), which two sends in a row (a round's, then a save's) would hit.
        timeout_seconds=None first waits for the previous call: runners answer it at once, even one still
        sampling after a Ctrl-C, since they ran it before that sample. A runner runs its calls in order, so the
        weights are in place before its next sample call.
        """
        self.env_runner_group.foreach_env_runner_async_fetch_ready(
            func="set_state", tag="set_state", kwargs={"state": weights}, timeout_seconds=None
        )
        if self.env_runner_group.local_env_runner is not None:
            self.env_runner_group.local_env_runner.set_state(ray.get(weights))


def learn_pending(algo: Any) -> None:
    """Make `algo` hold everything it sampled (a no-op for RLlib's own PPO, which never leaves a batch waiting)."""
    if isinstance(algo, OverlappedPPO):
        algo.learn_pending()
