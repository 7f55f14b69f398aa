"""Ctrl-C held while native libraries load: `esper-ray` exits 130 with one line whenever Ctrl-C comes.

torch's import runs C++ that calls back into Python. A KeyboardInterrupt raised inside such a callback (Python
raises it at the next bytecode, wherever that is) escapes through pybind11 as a 12-50 line traceback, or as
`terminate called after throwing an instance of 'pybind11::error_already_set'` and SIGABRT. Held until the
import is done, the same Ctrl-C is raised where the command handles it (cli.main: "interrupted", exit 130).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Within: SIGINT is noted, not raised; on leaving (normally), a noted one is raised as KeyboardInterrupt.

    Python sets signal handlers from the main thread only; elsewhere, and where SIGINT is ignored, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield  # SIG_IGN: started in the background or under nohup, where Ctrl-C is not this process's to take
        return
    held: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt
