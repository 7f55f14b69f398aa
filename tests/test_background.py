"""InBackground and WorkerThread: where a background job runs, its result and its error."""

from __future__ import annotations

import threading

import pytest

from esper_ray.train.process.background import InBackground, WorkerThread


def test_jobs_put_to_one_worker_thread_all_run_there_in_order():
    worker = WorkerThread("test-worker")
    ran: list[tuple[int, int]] = []
    jobs = [InBackground(lambda i=i: ran.append((i, threading.get_ident())) or i, "job", worker) for i in range(5)]
    assert [job.result() for job in jobs] == list(range(5))
    assert [i for i, _ in ran] == list(range(5))
    assert {ident for _, ident in ran} == {worker.thread.ident}
    assert worker.thread.ident != threading.get_ident() and worker.thread.daemon


def test_without_a_worker_each_job_gets_a_thread_of_its_own():
    # what a leading round did before WorkerThread: torch's per-thread caches started empty every round
    threads = [InBackground(threading.current_thread, "job").result() for _ in range(3)]
    assert len(set(threads)) == 3 and threading.current_thread() not in threads
    worker = WorkerThread("test-worker")
    assert {InBackground(threading.current_thread, "job", worker).result() for _ in range(3)} == {worker.thread}


def test_a_failed_job_reraises_to_its_caller_and_the_worker_runs_the_next():
    worker = WorkerThread("test-worker")

    def fail() -> None:
        raise ValueError("boom")

    failed = InBackground(fail, "job", worker)
    after = InBackground(lambda: "next", "job", worker)
    with pytest.raises(ValueError, match="boom"):
        failed.result()
    assert after.result() == "next" and worker.thread.is_alive()
