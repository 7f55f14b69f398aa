"""End the Ray processes a command started when the command ends, even by `kill -9`.

A local Ray started by ray.init lives in processes of its own (GCS, raylet, dashboard, log monitor, and the
raylet's dashboard agent, runtime-env agent and workers). A driver that exits normally stops them; one killed
with SIGKILL cannot, and Ray's agents then outlived it (seen with Ray 2.60: both agents, reparented to init,
kept waiting on the dead GCS and ignored SIGTERM).

So a command that starts its own local Ray also starts this watcher in a session of its own (a Ctrl-C in the
terminal does not reach it). It holds the read end of a pipe whose write end only the command holds: when the
command ends, however it ends, the pipe closes. Until then the watcher notes the command's descendants every
second; then it stops those still running (SIGTERM, SIGKILL two seconds later) and exits. It knows processes by
pid and start time, so it never signals a process that merely reuses a noted pid, and it notes nothing but the
command's own descendants.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

import psutil

POLL_S = 1.0
GRACE_S = 2.0

_watcher: subprocess.Popen | None = None


def end_ray_processes_with_this_one() -> None:
    """Start the watcher for this process (once); its Ray processes end when it does."""
    global _watcher
    if _watcher is not None and _watcher.poll() is None:
        return
    _watcher = subprocess.Popen(
        [sys.executable, "-m", "esper_ray.train.process.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # its stdin's write end stays open in this process until it exits


def _descendants(pid: int, me: int) -> dict[tuple[int, float], psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    noted = {}
    for child in children:
        try:
            if child.pid != me:
                noted[(child.pid, child.create_time())] = child
        except psutil.Error:
            continue
    return noted


def watch(command_pid: int) -> None:
    """Note `command_pid`'s descendants until stdin closes, then end the ones still running."""
    me = os.getpid()
    noted: dict[tuple[int, float], psutil.Process] = {}
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            break  # the command ended: nobody holds the write end any more
        noted.update(_descendants(command_pid, me))
    # their own children started since the last look (the raylet's workers) go with them
    for process in list(noted.values()):
        noted.update(_descendants(process.pid, me))
    alive = [p for p in noted.values() if p.is_running()]  # is_running: same pid *and* start time
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass


if __name__ == "__main__":
    watch(int(sys.argv[1]))
