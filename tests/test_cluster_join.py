"""`esper-ray train --address auto` joins a cluster started with `ray start --head` in a subprocess.

Its own module: no other Ray may be running in this process while the external cluster is up.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RAY_CLI = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.expensive
def test_train_joins_a_cluster_started_with_ray_start(tmp_path):
    import ray

    assert not ray.is_initialized()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    port = _free_port()
    subprocess.run([RAY_CLI, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"],
                   check=True, env=env, capture_output=True, timeout=120)
    try:
        out = tmp_path / "joined"
        run = subprocess.run(
            [sys.executable, "-m", "esper_ray.cli", "train", "--address", "auto", "--rounds", "1", "--envs", "1",
             "--cpus-per-env", "0.5", "--max-epochs", "3", "--env", "batch_size=512", "--output", str(out)],
            env=env, capture_output=True, text=True, timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "round 1/1" in run.stdout and "Connecting to existing Ray cluster" in run.stderr
        assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["env_steps"] == 3
    finally:
        subprocess.run([RAY_CLI, "stop", "--force"], env=env, capture_output=True, timeout=120)
