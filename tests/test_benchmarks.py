"""benchmarks/throughput.py in its CPU mode, once, as a smoke test: it runs and prints its JSON (no timing is
asserted; speed figures belong to the benchmark's own output, on a named machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.expensive
def test_throughput_benchmark_runs_on_cpu_and_prints_one_json_line():
    run = subprocess.run([sys.executable, "benchmarks/throughput.py", "--rounds", "2", "--bare-seconds", "2"], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["machine"]["card"] == "no GPU" and report["setup"]["envs"] == 2
    figures = report["without_mps"]
    for key in ("bare_env_steps_per_s", "bare_samples_per_s", "train_env_steps_per_s", "train_samples_per_s", "train_over_bare"):
        assert figures[key] > 0, key
