"""SIGTERM stops a run as Ctrl-C does (raised as Terminated, a KeyboardInterrupt) and exits with 143."""

from __future__ import annotations

import os
import signal
import time

import pytest

from esper_ray.train.process.termination import EXIT_CODE, Terminated, received, sigterm_raises_terminated


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


def test_sigterm_acts_as_the_ctrl_c_handler_of_the_moment_and_notes_it_came():
    """`esper-ray ab`: Ray Tune's SIGINT handler stops an experiment cleanly; SIGTERM must reach it, not end the
    process (or raise inside Tune's loop, which skips its last save)."""
    from esper_ray.train.process.termination import sigterm_acts_as_ctrl_c

    calls = []
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))  # as Tune's handler does: note and return
    try:
        with sigterm_acts_as_ctrl_c():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not calls and time.monotonic() < deadline:
                time.sleep(0.01)
            assert calls == [signal.SIGINT] and received()
        assert signal.getsignal(signal.SIGTERM) == before_term
    finally:
        signal.signal(signal.SIGINT, before_int)
