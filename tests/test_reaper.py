"""train/process/reaper.py on its own: no Ray, no training run (tests/test_faults.py kills a real run's command)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from esper_ray.train.process import reaper


def test_the_watcher_ends_a_killed_commands_descendants_and_needs_no_ray():
    """The watcher runs with its stderr discarded, so a watcher that cannot start (psutil not importable without Ray
    imported first, as with Ray's vendored copy) would leave every Ray process of a `kill -9`ed command running."""
    command = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "time.sleep(120)",
        ]
    )
    watcher = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "esper_ray.train.process.reaper", str(command.pid)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while not children and time.monotonic() < deadline:
            time.sleep(0.1)
            children = psutil.Process(command.pid).children()
        time.sleep(3 * reaper.POLL_S)  # the watcher notes it
        command.kill()
        command.wait()
        assert len(children) == 1 and children[0].is_running()  # orphaned, as a killed command's Ray processes are
        watcher.stdin.close()  # the write end closes, as the command's does when it ends
        watcher.wait(timeout=30)
        importtime = watcher.stderr.read()
        assert watcher.returncode == 0, importtime[-2000:]
        assert not children[0].is_running()
        assert "ray" not in {line.split("|")[-1].strip() for line in importtime.splitlines()}  # psutil without Ray
    finally:
        for process in (command, watcher):
            process.kill()
        for child in children:
            if child.is_running():
                child.kill()
