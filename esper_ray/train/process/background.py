"""A function run in a daemon thread, its result or error handed to whoever waits for it."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class InBackground:
    """`fn()` in a daemon thread named `name` (a Ctrl-C must never wait for it at exit); result() re-raises its
    error. With `thread`, it runs there (after what was handed to it before) instead of in a thread of its own."""

    def __init__(self, fn: Callable[[], Any], name: str, thread: WorkerThread | None = None) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self.finished_at = 0.0

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as error:  # noqa: BLE001 - handed to the caller by result()
                self._error = error
            finally:
                self.finished_at = time.perf_counter()
                self._done.set()

        if thread is None:
            threading.Thread(target=run, name=name, daemon=True).start()
        else:
            thread.put(run)

    def result(self) -> Any:
        self._done.wait()  # interruptible: a Ctrl-C reaches the main thread here
        if self._error is not None:
            raise self._error
        return self._value


class WorkerThread:
    """One daemon thread that runs what is put to it, one at a time, in order, for work that must keep its thread
    from call to call: what torch caches per thread (cuDNN's handles and execution plans) is built again in every
    new thread, and a leading round sampled in a new thread each time spent 3.3 ms in each eager convolution instead
    of 0.13 (benchmarks/results/throughput_h200x2_2026-11-30c.jsonl: the runners' profiles)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def put(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            self._jobs.get()()  # InBackground's jobs catch their own errors
