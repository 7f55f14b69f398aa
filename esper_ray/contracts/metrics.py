"""Names of the metrics esper-ray logs (under RLlib's `env_runners/` and `learners/<module>/` groups)."""

from __future__ import annotations

FINAL_ACCURACY = "esper/final_accuracy"
FINAL_ACCURACY_MIN = "esper/final_accuracy_min"
FINAL_ACCURACY_MAX = "esper/final_accuracy_max"
INITIAL_ACCURACY = "esper/initial_accuracy"
PARAMS_ADDED = "esper/params_added"
HOST_PARAMS = "esper/host_params"
SEEDS_GERMINATED = "esper/seeds_germinated"
SEEDS_FOSSILIZED = "esper/seeds_fossilized"
SEEDS_PRUNED = "esper/seeds_pruned"
ROLLBACKS = "esper/rollbacks"
OP_COUNT_PREFIX = "esper/op_"
PHASE_TIME_PREFIX = "esper/time_"
GRAD_SCALE_MIN = "esper/grad_scale_min"
GRAD_SCALE_MAX = "esper/grad_scale_max"
EPISODES = "esper/episodes"
EPISODE_RETURN = "esper/episode_return"
"""This round's mean episode return (RLlib's episode_return_mean is smoothed over the last 100 episodes)."""

# RLlib's own keys that the progress line reads.
ENV_RUNNERS = "env_runners"
LEARNERS = "learners"
ENV_STEPS_SAMPLED = "num_env_steps_sampled"
ENV_STEP_FAILURES = "num_env_step_failures"
DEFAULT_MODULE = "default_policy"
