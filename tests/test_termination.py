"""SIGTERM stops a run as Ctrl-C does (raised as Terminated, a KeyboardInterrupt) and exits with 143."""

from __future__ import annotations

import os
import signal
import time

import pytest

from esper_ray.train.termination import EXIT_CODE, Terminated, received, sigterm_raises_terminated


def test_sigterm_inside_raises_terminated_which_ctrl_c_handlers_catch_and_the_handler_is_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as stopped:  # where a run catches Ctrl-C, it catches SIGTERM too
        with sigterm_raises_terminated():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler's exception ends the sleep at once; 30 s would only pass if it never came
    assert isinstance(stopped.value, Terminated) and received()
    with sigterm_raises_terminated():
        assert not received()  # each run starts with none seen (a Ctrl-C then reads as a Ctrl-C)
    assert signal.getsignal(signal.SIGTERM) == before
    assert EXIT_CODE == 143  # 128 + 15, what a shell reports for a process SIGTERM ended
