"""The morphogenetic environment (gymnasium). Registered as `esper_ray/Morphogenetic-v0`.

It is registered as nondeterministic: `info` carries wall-clock timings per phase, and CUDA kernels are not
bitwise reproducible. Observations and rewards on the CPU are reproducible for a fixed seed (tested).
"""

import gymnasium as gym

from esper_ray.env.morphogenetic_env import MorphogeneticEnv

ENV_ID = "esper_ray/Morphogenetic-v0"
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="esper_ray.env.morphogenetic_env:MorphogeneticEnv", nondeterministic=True)

__all__ = ["ENV_ID", "MorphogeneticEnv"]
