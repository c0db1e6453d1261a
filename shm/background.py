"""A long-lived worker thread for work taken off a routing thread's path.

Mapping a new table generation of a large table (verifying its checksum, validating
it) takes long enough to stall a routing thread; :class:`shm.TableReader` with
``background=True`` hands it to a :class:`BackgroundWorker` and keeps routing on the
previous table.

Why one long-lived thread instead of a thread per job: ``threading.Thread.start()``
blocks its caller until the new thread has run, and on a busy host a new thread can
wait for a core for milliseconds; handing a job to a running thread is a queue put.

Fork: threads do not exist in a forked child. A worker remembers the process that
started its thread; :meth:`BackgroundWorker.submit` in another process starts a new
thread there (jobs queued in the parent stay the parent's).
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["BackgroundWorker", "Job"]


class Job:
    """One piece of work handed to a :class:`BackgroundWorker`.

    Attributes
    ----------
    result : Any
        What the function returned (once :meth:`done`).
    error : BaseException or None
        What it raised instead.
    """

    __slots__ = ("_done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def done(self) -> bool:
        """True once the function returned or raised."""
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until :meth:`done` (at most ``timeout_s`` seconds); returns :meth:`done`."""
        return self._done.wait(timeout_s)

    def _run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to whoever looks at the job
            self.error = exc
        finally:
            self.fn = _ran  # a job kept for its result must not keep what fn referenced
            self._done.set()


def _ran() -> None:
    raise RuntimeError("this job already ran")


class BackgroundWorker:
    """Runs submitted jobs one at a time, in submission order, on one daemon thread.

    Parameters
    ----------
    name
        Name of the thread (shown by ``py-spy``, ``threading.enumerate()``).
    idle
        Called on the thread whenever no job came for ``idle_s`` seconds (say, to look
        for work nobody asked for yet). Must not wait for a job of this worker. Its
        exceptions are dropped: it is a best-effort look ahead, whatever it would have
        done the caller does itself later, and raises there.
    idle_s
        Seconds without a job before ``idle`` is called (again).
    """

    def __init__(
        self, name: str, *, idle: Callable[[], Any] | None = None, idle_s: float = 0.05
    ) -> None:
        self.name = name
        self.idle = idle
        self.idle_s = float(idle_s)
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Job | None] | None = None
        self._pid = 0
        self._closed = False
        _WORKERS.add(self)

    def start(self) -> None:
        """Start the thread now (else on the first :meth:`submit`); idempotent."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> queue.SimpleQueue[Job | None]:
        q = self._queue
        if q is None or self._pid != os.getpid():
            q = queue.SimpleQueue()
            thread = threading.Thread(
                target=_serve, args=(q, self.idle, self.idle_s), name=self.name, daemon=True
            )
            thread.start()
            self._queue, self._pid = q, os.getpid()
        return q

    def submit(self, fn: Callable[[], Any]) -> Job:
        """Queue ``fn`` to run on the thread; returns its :class:`Job` at once.

        Raises
        ------
        RuntimeError
            The worker was closed.
        """
        job = Job(fn)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"background worker {self.name} is closed")
            self._ensure().put(job)
        return job

    def close(self) -> None:
        """Let the thread end after the jobs already queued (does not wait for them)."""
        with self._lock:
            self._closed = True
            if self._queue is not None and self._pid == os.getpid():
                self._queue.put(None)
            self._queue = None


_WORKERS: weakref.WeakSet[BackgroundWorker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Another thread may have held a worker's lock at the fork; in the child nobody
    # would release it.
    for w in list(_WORKERS):
        w._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _serve(q: queue.SimpleQueue[Job | None], idle: Callable[[], Any] | None, idle_s: float) -> None:
    while True:
        try:
            job = q.get(timeout=idle_s) if idle is not None else q.get()
        except queue.Empty:
            try:
                idle()  # type: ignore[misc]
            except Exception:  # best effort (see BackgroundWorker: idle)
                pass
            continue
        if job is None:
            return
        job._run()
