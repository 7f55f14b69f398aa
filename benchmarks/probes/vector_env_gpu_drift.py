"""How far do a vector env's stacked steps drift from separate envs on a CUDA GPU, and why? (issue 77)

    python benchmarks/probes/vector_env_gpu_drift.py [A B C D]

Runs tests/test_vector_env.py's constructed 12 steps (its CONFIGS and scripted actions: a seed planted, blended,
fossilized, another pruned, resets) in fp32 as separate envs and as one VectorMorphogeneticEnv, under each setting
asked for: A TF32 in cuDNN on (torch's default) and CUDA graphs on, B TF32 off and graphs on, C TF32 on and graphs
off, D both off. Prints per setting the held stacks' captures and builds, then per step the relative difference of
each env's validation and training loss. What it found (H100, be48dd4;
benchmarks/results/vector_env_gpu_drift_h100_2026-12-07.txt): the captured steps follow the separate envs (B:
training losses within 3e-5); TF32 is what the test's fp32 comparison must turn off (a lone host's convolutions
round to TF32, the stacked 1x1 ones are batched products); and the validation loss of this starved host amplifies
any difference (eval-mode batch norm).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_vector_env import CONFIGS, STEPS, script, separate_envs  # noqa: E402

from esper_ray.env.vector_env import VectorMorphogeneticEnv  # noqa: E402

SETTINGS = {
    "A": ("tf32 on, graphs on", True, True),
    "B": ("tf32 off, graphs on", False, True),
    "C": ("tf32 on, graphs off", True, False),
    "D": ("tf32 off, graphs off", False, False),
}


def run(name: str, tf32: bool, graphs: bool) -> None:
    began = time.time()
    configs = [{**c, "device": "cuda", "amp": "off", "cuda_graphs": graphs} for c in CONFIGS]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        separate = separate_envs(configs)
        ours = VectorMorphogeneticEnv.of_configs(configs)
        separate.reset(seed=0), ours.reset(seed=0)
        rows = []
        for _ in range(STEPS):
            actions = script(separate.envs)
            *_, theirs = separate.step(actions)
            *_, mine = ours.step(actions)
            rows.append(
                {
                    key: np.round(np.abs(mine[key][m] - theirs[key][m]) / np.abs(theirs[key][m]), 5).tolist()
                    for key in ("val_loss", "train_loss")
                    if key in theirs
                    for m in [theirs["_" + key]]
                }
            )
    print(
        f"{name}: {time.time() - began:.0f} s, captures {ours.stacked_captures}, builds {ours.stack_builds}", flush=True
    )
    for t, row in enumerate(rows):
        print(f"  step {t} {row}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("vector_env_gpu_drift.py: needs a CUDA GPU")
    print(f"card: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for key in sys.argv[1:] or list(SETTINGS):
        run(*SETTINGS[key])


if __name__ == "__main__":
    main()
