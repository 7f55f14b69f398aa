#!/usr/bin/env bash
# GPU check and figures, for the device machine (see docs/gpu.md). Writes logs under ${OUT:-/tmp/esper-gpu}.
#   bash benchmarks/gpu_check.sh
set -uo pipefail
out="${OUT:-/tmp/esper-gpu}"; mkdir -p "$out"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
# The card and the commit go into every file that holds figures (benchmarks/README.md, "Results").
card="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo 'unknown (no git here)')"
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+"
echo "commit $commit" | tee -a "$out/gpu.txt"
# 1. The env's tests with device=auto, i.e. on CUDA here (streams, device-resident shards, GPU augmentation,
#    captured train steps, the text task and its transformer seeds, flex_attention included, and a flex_attention
#    seed trained through BLENDING with cuda_graphs on, the captured validation pass against the eager one, and the
#    compiled host blocks against the plain ones). Verbose, so that each test's outcome is in the log as it happens
#    (a run cut short still names a failed test); the summary goes to pytest_cuda.txt, and the slowest tests to the
#    log. Two torch threads a worker: with torch's default of one a core, 6 workers on 16 cores oversubscribed the
#    CPU and the set did not finish in 8 minutes (H200, 2026-11-27); with 2 threads, test_env.py, test_text_env.py
#    and the captured-pass CUDA test took 33 s.
OMP_NUM_THREADS=2 python3 -m pytest -n 6 -v --durations=20 -p no:cacheprovider tests/test_env.py tests/test_data.py tests/test_heuristic.py \
  tests/test_transformer.py tests/test_text_env.py tests/test_train_step.py tests/test_validation_graph.py \
  tests/test_morpho_forward.py tests/test_fused_block.py tests/test_graph_memory.py tests/test_gpu_wait.py -m "not expensive" > "$out/pytest_cuda_log.txt" 2>&1
{ echo "# $card, commit $commit"; grep -E "FAILED|ERROR|passed|failed" "$out/pytest_cuda_log.txt" | tail -20; } | tee "$out/pytest_cuda.txt"
# 2. Captured CUDA graphs train what the eager loop trains (per-epoch losses within float tolerance), and how fast.
python3 benchmarks/graph_check.py 2>&1 | tee "$out/graph_check.txt"
# 3. Seconds per env step by phase, on CUDA.
for args in "--task digits" "--task synthetic --batch-size 512" "--task synthetic --batch-size 512 --amp fp32"; do
  python3 benchmarks/env_step.py $args --device cuda --steps 30 2>&1 | tee -a "$out/env_step.txt"
done
# 4. Bare envs against `esper-ray train` on this GPU, with and without MPS (the README's table).
python3 benchmarks/throughput.py --gpu --mps 2> "$out/throughput_log.txt" | tee "$out/throughput.json"
# 5. On a machine of 2+ GPUs: where env processes asking 1/16 of a GPU run, with Ray's pick and spread (docs/gpu.md).
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  python3 benchmarks/placement_check.py 2> "$out/placement_log.txt" | tee "$out/placement.json"
fi
