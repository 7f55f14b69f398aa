"""Test-wide settings: Ray writes nothing into the real home directory and needs no auth token."""

from __future__ import annotations

import os
import tempfile

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["HOME"] = tempfile.mkdtemp(prefix="esper-ray-tests-home-")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray per test module, sized like CI (2 CPUs)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a recorded cluster
    yield ray
    ray.shutdown()
