"""Names shared by an A/B trial (trainable.py), which reports them, and the readers of its results (results.py),
which need no Ray to read them back."""

from __future__ import annotations

TRIAL_KEY = "trial"
"""The key of a trial's own settings (arm, seed, controller, train, ...) in its Tune config."""
SUMMARY_PREFIX = "round/"
"""Prefix of a PPO round's summary in a trial's results."""
EVAL_PREFIX = "eval/"
"""Prefix of the evaluation's metrics in a trial's last result."""
SETUP_SECONDS = "trial/setup_s"
"""Seconds the trial's setup took (for a PPO trial: starting its env runners and learner), in its first result."""
RUNNERS_UP_SECONDS = "trial/env_runners_up_s"
"""Of a PPO trial's setup: seconds until the last env runner's process was up with its imports done."""
RUNNER_INIT_SECONDS = "trial/env_runner_init_s"
"""Of a PPO trial's setup: the longest env runner's own init after that (its env, GPU share and policy)."""

TORCH_THREADS = "trial/torch_threads"
"""torch threads of the processes that ran the trial's evaluation episodes (the most of them), in its last result."""


def per_kparam(accuracy: float, total_params: int) -> float:
    """Accuracy per 1,000 parameters of the final grown model."""
    return accuracy / (total_params / 1000.0)
