"""SIGTERM (what a job manager, `ray job stop` or `kill` sends) stops `esper-ray train` as one Ctrl-C does: the
round in progress is dropped, the last finished round is kept, and the command says so in one line and exits
with 143 (128 + SIGTERM, as a shell reports a process that SIGTERM ended).

Without this, Ray's core worker handles SIGTERM in the driver with its native failure handler (installed while
ray.init connects), which prints a stack dump (`*** SIGTERM received at time=... PC: @ 0x...`) that reads like
a crash, and nothing is saved.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

EXIT_CODE = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM; a KeyboardInterrupt, so every place that stops a run cleanly on
    Ctrl-C does the same for it."""


_received = threading.Event()
"""Set by the handler. The exception alone cannot say it was SIGTERM: a signal that arrives while ray.get()
waits surfaces as a plain KeyboardInterrupt (Ray's C++ wait loop raises its own when a handler raised)."""


def received() -> bool:
    """Whether SIGTERM arrived since sigterm_raises_terminated() was last entered."""
    return _received.is_set()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    _received.set()
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises_terminated() -> Iterator[None]:
    """Within: SIGTERM raises Terminated. Enter it after ray.init, whose core worker installs its own handler.

    Python can only set signal handlers from the main thread; elsewhere (a Tune trial's thread) this does nothing.
    """
    with _sigterm_handler(_raise_terminated):
        yield


@contextlib.contextmanager
def sigterm_acts_as_ctrl_c() -> Iterator[None]:
    """Within: SIGTERM runs whatever handles Ctrl-C now (SIGINT's Python handler), after noting that it came.

    Ray Tune stops an experiment cleanly on its first SIGINT (its handler saves the experiment's state and lets
    fit() return); a KeyboardInterrupt raised inside its loop instead would skip that save. Enter it after
    ray.init, like sigterm_raises_terminated; in other threads it does nothing.
    """

    def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
        _received.set()
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)  # Tune's handler, or Python's default one, which raises KeyboardInterrupt
        else:
            raise Terminated()

    with _sigterm_handler(as_ctrl_c):
        yield


@contextlib.contextmanager
def _sigterm_handler(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Within, in the main thread: `handler` answers SIGTERM (and no SIGTERM has been received yet); the handler
    before is restored after. Elsewhere it does nothing: Python sets signal handlers from the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: the handler before was not Python's (Ray's native one); the default ends the process quietly
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
