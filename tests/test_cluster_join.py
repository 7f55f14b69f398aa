"""`esper-ray train --address HOST:PORT` joins a cluster started with `ray start --head`.

The cluster is this test's own: its own temp folder and port, `ray start --block` in a process group the test
owns, joined by its explicit address, and stopped by signalling that group only. (`ray stop` would stop every
Ray of the user on this machine, and `--address auto` could join someone else's cluster.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

RAY_CLI = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the test cluster did not open port {port} within {timeout}s")


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the cluster's process group (`ray start --block` then stops its Ray processes), SIGKILL leftovers."""
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.expensive
def test_train_joins_a_cluster_started_with_ray_start_at_its_address(tmp_path):
    import ray

    assert not ray.is_initialized()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="er", dir="/tmp")  # short: Ray's socket paths must fit in 107 characters
    head = subprocess.Popen(
        [
            RAY_CLI,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for_port(port, timeout=120)
        out = tmp_path / "joined"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "esper_ray.cli",
                "--verbose",
                "train",
                "--address",
                f"127.0.0.1:{port}",
                "--rounds",
                "1",
                "--envs",
                "1",
                "--cpus-per-env",
                "0.5",
                "--max-epochs",
                "3",
                "--episodes-per-env",
                "1",
                "--env",
                "batch_size=512",
                "--output",
                str(out),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "round 1/1" in run.stdout and "Connecting to existing Ray cluster" in run.stderr
        assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["env_steps"] == 3
    finally:
        _stop_group(head)
    assert head.poll() is not None


def test_a_wrong_address_fails_in_seconds_with_one_line(tmp_path):
    start = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "esper_ray.cli",
            "train",
            "--address",
            f"127.0.0.1:{_free_port()}",
            "--rounds",
            "1",
            "--output",
            str(tmp_path / "x"),
        ],
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "no Ray cluster answered" in run.stderr and "Traceback" not in run.stderr
    assert time.monotonic() - start < 120
