"""Test-wide settings: Ray writes nothing into the real home directory and needs no auth token."""

from __future__ import annotations

import os
import tempfile

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["HOME"] = tempfile.mkdtemp(prefix="esper-ray-tests-home-")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# One torch thread per process (before torch is imported; the commands and Ray workers the tests start inherit it):
# xdist runs two workers on CI's 2 cores, each beside Ray workers and command subprocesses, and torch's default of one
# thread per core then oversubscribes the cores; two 3-episode heuristic runs side by side took 18 s each with 2
# threads and 5-6 s with 1, and such a test took 185 s inside the suite.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray per test module, sized like CI (2 CPUs)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a recorded cluster
    yield ray
    ray.shutdown()


# The files that take longest (seconds of one worker on 2 cores, measured once: test_train 605, test_experiments
# 315, test_faults 237, test_readme 150 of 1,814 in all) start first, so that xdist's two workers end together; its
# default order, by number of tests, left the few long tests of test_faults and test_readme for the end
# (pyproject.toml turns that order off with --no-loadscope-reorder).
LONGEST_FIRST = ("test_train.py", "test_experiments.py", "test_faults.py", "test_readme.py")


def pytest_sessionstart(session):
    """Say before the first dot that the long files come first, so a progress line that stands still for minutes
    does not read as a hang (the controller only: xdist's workers print nothing)."""
    if hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"esper-ray: the long files run first ({', '.join(LONGEST_FIRST)}: Ray clusters and training "
            "runs, minutes each); the percentage may stand still for minutes while they run. The whole "
            "suite takes 10-25 minutes on 2 cores; -m 'not expensive' skips the Ray tests."
        )


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: each file keeps its order
