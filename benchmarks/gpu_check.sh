#!/usr/bin/env bash
# GPU check and figures, for the device machine (see README "GPU"). Writes logs under ${OUT:-/tmp/esper-gpu}.
#   bash benchmarks/gpu_check.sh
set -uo pipefail
out="${OUT:-/tmp/esper-gpu}"; mkdir -p "$out"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
# 1. The env's tests with device=auto, i.e. on CUDA here (streams, device-resident shards, GPU augmentation).
python3 -m pytest -q -x -p no:cacheprovider tests/test_env.py tests/test_data.py tests/test_heuristic.py 2>&1 | tail -5 | tee "$out/pytest_cuda.txt"
# 2. Seconds per env step by phase, on CUDA.
for args in "--task digits" "--task synthetic --batch-size 512" ; do
  python3 benchmarks/env_step.py $args --device cuda --steps 30 2>&1 | tee -a "$out/env_step.txt"
done
python3 benchmarks/env_step.py --task synthetic --batch-size 512 --device cuda --steps 30 --amp bf16 2>&1 | tee -a "$out/env_step.txt"
python3 benchmarks/env_step.py --task synthetic --batch-size 512 --device cuda --steps 30 --amp fp16 2>&1 | tee -a "$out/env_step.txt"
# 3. PPO with two envs sharing the GPU (0.25 each) and a GPU learner (0.5): 1 GPU in all.
python3 -m esper_ray.cli train --task synthetic --env synthetic_size=20000 --env batch_size=512 --envs 2 \
  --gpus-per-env 0.25 --learner-gpus 0.5 --rounds 3 --max-epochs 10 --model gpu --output "$out/ppo" 2>&1 \
  | grep -v -i "warn\|deprecat" | tail -8 | tee "$out/ppo.txt"
