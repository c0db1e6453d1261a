"""Recorders for threaded workers: a row per thread, or one row behind a lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shm.counters.recorder import Recorder
from shm.counters.store import CounterStore
from shm.errors import SlotOwnershipError


class _Forwarding:
    """The recording calls of :class:`Recorder`, forwarded through one method.

    ``_run`` picks the row's recorder and guards the call (a lock, or a row per thread);
    each method takes and returns what :class:`Recorder`'s of the same name does.
    """

    def _run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def add_calls(self, *args: Any) -> None:
        """See :meth:`Recorder.add_calls`."""
        self._run(Recorder.add_calls, *args)

    def record_start(self, *args: Any, **kwargs: Any) -> int:
        """See :meth:`Recorder.record_start`."""
        return self._run(Recorder.record_start, *args, **kwargs)

    def record_end(self, *args: Any, **kwargs: Any) -> None:
        """See :meth:`Recorder.record_end`."""
        self._run(Recorder.record_end, *args, **kwargs)

    def count(self, decisions: int, fallbacks: int = 0, moves: int = 0) -> None:
        """See :meth:`Recorder.count`."""
        self._run(Recorder.count, decisions, fallbacks, moves)

    def tally(self, field: str, n: int) -> None:
        """See :meth:`Recorder.tally`."""
        self._run(Recorder.tally, field, n)

    def record_reports(self, *args: Any) -> None:
        """See :meth:`Recorder.record_reports`."""
        self._run(Recorder.record_reports, *args)


class LockedRecorder(_Forwarding):
    """One row shared by all threads of a process, calls serialized by a lock.

    Parameters
    ----------
    recorder
        The process's :class:`Recorder`.

    Attributes
    ----------
    recorder : Recorder
        The row's recorder.
    lock : threading.Lock
        Held around every call into it: a caller that records several steps at once
        (say a fan-out's start and a routed batch's counts) may hold it around them and
        call :attr:`recorder` directly.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.lock = threading.Lock()

    @property
    def row(self) -> int:
        """The worker slot (row) recorded into."""
        return self.recorder.row

    def _run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self.recorder, *args, **kwargs)

    def release(self, now_ns: int | None = None) -> None:
        """Give the slot back."""
        with self.lock:
            self.recorder.release(now_ns)


class ThreadRecorder(_Forwarding):
    """A row per thread, claimed on each thread's first call (no lock on the way).

    A thread's first call claims its row (a ``flock`` and a ``/proc`` read, once);
    later calls take no lock. Each thread holds a row for the life of the
    recorder, so the counters need a row per thread of every worker (see README,
    "gthread workers"); :class:`LockedRecorder` needs one row per process.

    Parameters
    ----------
    store
        The counters to claim rows from.
    """

    def __init__(self, store: CounterStore) -> None:
        self._store = store
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Recorder] = []
        self._released = False

    def _mine(self) -> Recorder:
        rec = getattr(self._local, "rec", None)
        if rec is None:
            with self._lock:  # claims are rare; serialized so none follows release()
                if self._released:
                    raise SlotOwnershipError(
                        "this per-thread recorder was released; claim a new one"
                    )
                rec = self._store.claim(thread_id=threading.get_ident())
                self._all.append(rec)
            self._local.rec = rec
        return rec

    def _run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return method(self._mine(), *args, **kwargs)

    @property
    def rows(self) -> list[int]:
        """Rows claimed so far (one per thread that recorded)."""
        with self._lock:
            return [r.row for r in self._all]

    def release(self, now_ns: int | None = None) -> None:
        """Give back every thread's slot; the recorder cannot be used afterwards.

        A thread still in a request then gets :class:`~shm.errors.SlotOwnershipError`
        from its ``record_end`` (its in-flight counts were released with its row), as
        from any later call; it never lands in a new row, which would drive that row's
        counts negative.
        """
        with self._lock:
            self._released = True
            recs, self._all = self._all, []
        for rec in recs:
            rec.release(now_ns)
