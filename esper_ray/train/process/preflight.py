"""Check a run's env settings in this process before any actor starts.

Without this, a bad slot or a missing data folder failed inside every env runner, and the user saw 240-260
lines of repeated tracebacks ending in an IndexError. Here the env is built and reset once, on the CPU (this
process may have no GPU), so the same mistakes end in one line that names the setting.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from esper_ray.contracts.env_config import MIXED_AMP_MODES
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.env.morphogenetic_env import MorphogeneticEnv


def check_env_config(cfg: TrainConfig, log: Callable[[str], None] = print) -> None:
    """Raise ValueError/FileNotFoundError for settings an env runner would fail on; say once what is ignored."""
    env_config = cfg.env_config(shard=0, num_shards=cfg.total_envs)
    device = str(env_config.get("device", "auto"))
    if device.startswith("cuda") and cfg.gpus_per_env == 0:
        raise ValueError(
            f"env device={device!r} but gpus_per_env=0: env runners get no GPU; give them a share with "
            f"--gpus-per-env (0.25 puts four envs on a GPU), or use --env device=auto"
        )
    on_cpu = device == "cpu" or (device == "auto" and cfg.gpus_per_env == 0)
    if on_cpu and env_config.get("amp") in MIXED_AMP_MODES:
        log(f"note: amp={env_config['amp']} applies on CUDA only; these env runners train on the CPU in fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = MorphogeneticEnv({**env_config, "device": "cpu"})
        env.reset(seed=cfg.seed)
