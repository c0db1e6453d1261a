"""shm.BackgroundWorker: one long-lived thread per process runs jobs in order."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shm import BackgroundWorker
from tests.background_harness import fork_while_locked, run_forked


def test_jobs_run_in_order_on_one_named_thread_and_submit_does_not_wait():
    w = BackgroundWorker("cslb-test-bg")
    gate = threading.Event()
    seen: list[tuple[int, str]] = []
    try:
        first = w.submit(lambda: gate.wait(10))
        jobs = [
            w.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
            for i in range(5)
        ]
        assert not first.done() and not any(j.done() for j in jobs)  # queued behind the gate
        gate.set()
        assert all(j.wait(10) for j in jobs)
        assert seen == [(i, "cslb-test-bg") for i in range(5)]
        names = [t.name for t in threading.enumerate()]
        assert names.count("cslb-test-bg") == 1
    finally:
        w.close()


def test_a_failing_job_hands_its_error_over_and_the_thread_carries_on():
    w = BackgroundWorker("cslb-test-bg-err")
    try:
        bad = w.submit(lambda: 1 / 0)
        good = w.submit(lambda: 42)
        assert good.wait(10) and bad.done()
        assert isinstance(bad.error, ZeroDivisionError) and bad.result is None
        assert good.error is None and good.result == 42
    finally:
        w.close()


def test_a_closed_worker_refuses_jobs_and_its_thread_ends():
    w = BackgroundWorker("cslb-test-bg-close")
    done = w.submit(lambda: "ran")
    w.close()
    assert done.wait(10) and done.result == "ran"  # queued before close: still runs
    with pytest.raises(RuntimeError, match="cslb-test-bg-close is closed"):
        w.submit(lambda: None)
    for t in threading.enumerate():
        if t.name == "cslb-test-bg-close":
            t.join(10)
            assert not t.is_alive()


def _in_child(w: BackgroundWorker, conn) -> None:
    try:
        job = w.submit(lambda: (os.getpid(), threading.current_thread().name))
        conn.send(job.result if job.wait(10) else "timed out")
    except BaseException as exc:
        conn.send(repr(exc))
    finally:
        os._exit(0)


def test_a_forked_child_gets_a_thread_of_its_own():
    w = BackgroundWorker("cslb-test-bg-fork")
    gate = threading.Event()
    try:
        busy = w.submit(lambda: gate.wait(10))  # the parent's thread is busy at the fork
        got, pid = run_forked(_in_child, w)
        assert got == (pid, "cslb-test-bg-fork")
        assert not busy.done()  # the parent's own job is untouched
        gate.set()
        assert busy.wait(10)
    finally:
        gate.set()
        w.close()


def test_a_finished_job_keeps_its_result_but_not_what_its_function_referenced():
    import gc
    import weakref

    class Big:
        pass

    big = Big()
    ref = weakref.ref(big)
    w = BackgroundWorker("cslb-test-bg-ref")
    try:
        job = w.submit(lambda big=big: 7)
        del big
        assert job.wait(10) and job.result == 7
        gc.collect()
        assert ref() is None
        with pytest.raises(RuntimeError, match="already ran"):
            job.fn()
    finally:
        w.close()


def test_idle_is_called_on_the_thread_between_jobs_and_its_errors_are_dropped():
    calls: list[str] = []

    def idle():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise RuntimeError("a look ahead that failed")

    w = BackgroundWorker("cslb-test-bg-idle", idle=idle, idle_s=0.005)
    try:
        w.start()
        deadline = time.monotonic() + 10
        while len(calls) < 3:  # the first call raised: the thread carried on
            assert time.monotonic() < deadline
            time.sleep(0.002)
        assert set(calls) == {"cslb-test-bg-idle"}
        assert w.submit(lambda: 5).wait(10)
    finally:
        w.close()


def test_a_child_forked_while_another_thread_holds_the_lock_can_submit():
    w = BackgroundWorker("cslb-test-bg-forklock")
    try:
        assert fork_while_locked(w, lambda w: w.submit(lambda: 5).wait(5))
    finally:
        w.close()
