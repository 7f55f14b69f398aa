"""A function run in a daemon thread, its result or error handed to whoever waits for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class InBackground:
    """`fn()` in a daemon thread (a Ctrl-C must never wait for it at exit); result() re-raises its error."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
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

        threading.Thread(target=run, name=name, daemon=True).start()

    def result(self) -> Any:
        self._done.wait()  # interruptible: a Ctrl-C reaches the main thread here
        if self._error is not None:
            raise self._error
        return self._value
